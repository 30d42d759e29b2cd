"""Compile a fit or a call of a network into a :class:`Plan` of tasks.

A plan is a list of :class:`Task` in a topological order.  Each task has

* ``kind``: ``"source"`` (a value known before the run: source data, already
  row-selected), ``"eval"`` (apply a node's operation), ``"fit"`` (train one
  machine) or ``"move"`` (copy a value to another device);
* ``deps``: the keys of the tasks whose values it consumes, in argument order;
* ``lane``: the independent branch it belongs to, assigned with GrCUDA's
  policy (a chain stays on its lane, a parent's first child inherits the
  parent's lane, other children take a free lane or open a new one, up to
  ``max_lanes``).  Lanes are assigned when first needed (``plan.n_lanes``,
  the streams executor), not at compile time: serial and threads runs never pay for them.

Machines that skip cost no task.  Every executor runs the same plan.

>>> import numpy as np, gpunets as gn
>>> X = gn.source(np.ones(3), name="X")
>>> p = compile_call([X + 1, X * 2], {}, rows=None)
>>> [(t.kind, t.label) for t in p.tasks]
[('source', 'X'), ('eval', 'add(X, 1)'), ('eval', 'mul(X, 2)')]
>>> p.n_lanes, [t.lane for t in p.tasks[1:]]
(2, [0, 1])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np

from .cache import CACHE, digest, machine_caches, operation_key, token, value_key
from .config import get_config
from .data import check_placeable, device_of, installed, is_cupy_array, n_rows, take_rows, to_device
from .value_types import host_only
from ._gpulibs import loaded_cupy
from .devices import (CPU, Device, check_available, current_placement, device_exists, is_host_only, local_ordinal,
                      placement_override,
                      resolve, same_device)
from .estimators import (apply_estimator, fit_estimator, fit_transform_estimator, is_frozen_estimator, partial_fit_estimator,
                         sklearn_config_delta, static_estimator)
from .exceptions import NetworkError, NotFittedError
from .fingerprint import scope
from .fitted_machine import MACHINE_VALUE, FittedMachine, state_report, view_of_fit
from .graph import Upstream, machine_sources, op_nodes, upstream_machines
from .machines import STATIC, FittedState, Machine, labels
from .models import is_cuml_estimator, resolve_estimator
from .nodes import AbstractNode, Node, Source, data_not_saved, is_node
from .weights import check_weight_rows, check_weight_values, keywords_fallback

__all__ = ["Task", "Plan", "compile_fit", "compile_call", "assign_lanes"]


class Task:
    """One unit of work in a plan (its label is computed only when asked for)."""

    __slots__ = ("key", "kind", "_label", "fn", "deps", "lane", "device", "node", "machine", "value", "cost",
                 "commit")

    def __init__(self, key: int, kind: str, fn: Callable[..., Any] | None, deps: tuple[int, ...] = (),
                 label: str | None = None, lane: int = -1, device: str = "cpu", node: AbstractNode | None = None,
                 machine: "Machine | None" = None, value: Any = None, cost: float = 1.0,
                 commit: Callable[..., None] | None = None) -> None:
        self.key, self.kind, self._label, self.fn, self.deps = key, kind, label, fn, deps
        self.lane, self.device, self.node, self.machine = lane, device, node, machine
        self.value = value            # for "source" tasks
        self.cost = cost
        self.commit = commit          # "fit" tasks: installs the fitted state on the client

    @property
    def label(self) -> str:
        if self._label is None:
            self._label = self.node._short() if self.node is not None else self.kind
        return self._label

    def __repr__(self) -> str:
        return f"<Task {self.key} {self.kind} {self.label} lane={self.lane} deps={list(self.deps)}>"


@dataclass(eq=False)
class Plan:
    """Tasks in topological order, the keys of the outputs, and what each machine will do."""

    kind: str                           # "fit" or "call"
    tasks: list[Task]
    outputs: tuple[int, ...]
    actions: dict[Any, str] = field(default_factory=dict)
    max_lanes: int | None = None        # the cap :meth:`assign_lanes` uses
    consumers: list[list[int]] = field(default_factory=list)
    _n_lanes: int = -1                  # -1: lanes not assigned yet
    executor_reason: str = ""           # why the executor that ran it was chosen (set by get_executor)
    # scikit-learn's configuration where the plan was made, where it differs from a new thread's (None: same):
    # the executors run the tasks under it, as scikit-learn's Parallel does (its configuration is per thread)
    sklearn_config: dict[str, Any] | None = None

    @property
    def n_lanes(self) -> int:
        """The number of lanes (independent branches, capped at ``max_lanes``).

        Lanes matter to the streams executor and to ``executor="auto"`` only, so they are
        assigned on first use rather than at compile time.
        """
        if self._n_lanes < 0:
            assign_lanes(self, self.max_lanes)
        return self._n_lanes

    def __post_init__(self) -> None:
        cons: list[list[int]] = [[] for _ in self.tasks]
        for t in self.tasks:
            for d in t.deps:
                cons[d].append(t.key)
        self.consumers = cons

    @property
    def runnable(self) -> list[Task]:
        return [t for t in self.tasks if t.kind != "source"]

    @property
    def width(self) -> int:
        return self.n_lanes

    def machine_label(self, m: Any) -> str:
        """The machine's label in this network (``Ridge#2`` when two share a class)."""
        machines = list(self.actions) if self.actions else list(
            upstream_machines([t.node for t in (self.tasks[k] for k in self.outputs) if t.node is not None]))
        return labels(machines).get(m, m.label)

    def path_to_output(self, key: int) -> list[Task]:
        """The chain of tasks from ``key`` to an output (for error messages)."""
        path = [self.tasks[key]]
        seen = {key}
        while path[-1].key not in self.outputs and self.consumers[path[-1].key]:
            nxt = self.consumers[path[-1].key][0]
            if nxt in seen:
                break
            seen.add(nxt)
            path.append(self.tasks[nxt])
        return path


class _Builder:
    """Turns nodes into tasks, memoised so a node reached twice is computed once."""

    def __init__(self, *, rows: Any, bindings: dict[int, Any], mode: str, cache: bool = False) -> None:
        self.rows = rows
        self.bindings = bindings      # source uid -> replacement data
        self.mode = mode              # "fit" (sources at rows) or "call"
        self.tasks: list[Task] = []
        self.memo: dict[int, int] = {}
        self.fit_key: dict[int, int] = {}
        self.dev: list[Any] = []                       # task key -> Device its value lives on
        self.mach_dev: dict[int, tuple[Any, str]] = {}  # machine uid -> (Device, path) of this plan's fit
        self.fit_args: dict[int, tuple[Any, int, Any]] = {}  # machine uid -> (estimator, n_args, resolved)
        self.fit_action: dict[int, str] = {}         # machine uid -> "train" / "update" in this plan
        self.moves: dict[tuple[int, Any, str], int] = {}
        self._placed: dict[Any, Any] = {}
        self.floating: set[int] = set()   # tasks of input-less nodes placed by default: they follow their consumers
        self._names: dict[Any, str] = {}             # Device -> its string, computed once
        self.states: dict[int, Any] = {}             # machine uid -> the fitted state this plan uses
        self.stale: list[tuple[Any, list[Any]]] = []  # (machine, upstream machines it is out of step with)
        # the cache of node outputs (gpunets.cache): how each task's key is made, the keys made, the hits
        self.cache = cache
        self.recipes: dict[int, tuple[tuple[int, ...], Any]] = {}
        self.ckeys: dict[int, bytes | None] = {}
        self.n_hits = 0
        self.budget = int(get_config()["cache_bytes"]) if cache else 0

    def placed(self, spec: Any, what: "str | Callable[[], str]", owner: Any = None) -> Any:
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

    def add(self, *, device: Any = None, recipe: Any = None, **kw: Any) -> int:
        key = len(self.tasks)
        if recipe is not None:
            self.recipes[key] = recipe
        dev = CPU if device is None else device
        name = self._names.get(dev)
        if name is None:
            name = self._names[dev] = str(dev)
        self.tasks.append(Task(key=key, device=name, **kw))
        self.dev.append(dev)
        return key

    def node(self, n: AbstractNode) -> int:
        key = self.memo.get(n._uid)
        if key is not None:
            return key
        for x in op_nodes([n], done=self.memo):   # only the nodes not built yet: linear over a compile
            self.memo[x._uid] = self._make(x)
        return self.memo[n._uid]

    def _make(self, x: AbstractNode) -> int:
        if isinstance(x, Source):
            value = self._source_value(x)
            recipe = ((), partial(_source_head, x, self.rows)) if self.cache else None
            return self.add(kind="source", label=x.label, fn=None, node=x, value=value, device=device_of(value),
                            recipe=recipe)
        assert isinstance(x, Node)
        m = x.machine
        fk = None
        frames = "auto"
        if m is not None:
            fk = self.fit_key.get(m._uid)
            st = m._state             # read once: a fit in another thread may replace it
            if fk is None and st is None and m.static:
                st = _static_state(m)   # an unfitted static machine applies a copy of its model (MLJ)
            if fk is None and st is None:
                raise NotFittedError(m._not_fitted_message() + f" (needed by node {x._short()})")
            if fk is not None:
                dev, path = self.mach_dev[m._uid]
            else:
                if self.mode == "call" and m._uid not in self.states:
                    self._check_in_step(m, st)
                dev, path = Device.parse(st.device), st.path
            if path == "array_api":
                frames = "array"
        else:
            dev = self._op_device(x)
        if m is not None and x.operation == MACHINE_VALUE:
            return self._machine_value(x, m, fk, st, dev)
        deps: list[int] = []
        spec: list[tuple[bool, Any]] = []    # what the cache keys read: the constants as the user gave them
        run: list[tuple[bool, Any]] = []     # what the task gets: array constants moved to the node's device
        plain = True                  # every argument a node, in order: call the operation as it is
        memo, moved = self.memo, self.moved
        for a in x._args:
            if isinstance(a, AbstractNode):
                spec.append((True, len(deps)))
                run.append(spec[-1])
                deps.append(moved(memo[a._uid], dev, frames))
            else:
                plain = False
                spec.append((False, a))
                run.append((False, _constant_on(a, dev)))
        if m is None:
            fn = x.operation if plain else partial(_call_with_constants, x.operation, tuple(run))
            recipe = (tuple(deps), partial(_function_head, x.operation, tuple(spec))) if self.cache else None
            return self.add(kind="eval", fn=fn, deps=tuple(deps), node=x, cost=1.0, device=dev, recipe=recipe)
        ck, owner, recipe = None, 0, None
        if self.cache:
            est = self.fit_args[m._uid][0] if fk is not None else st.estimator
            owner = token(est) or 0
            head = None if not owner else digest(
                b"op", str(owner).encode(), str(m._version + 1 if fk is not None else st.version).encode(),
                str(x.operation).encode(), f"{dev} {frames}".encode(), _constants_key(spec))
            recipe = (tuple(deps), head)
            ck = self.key_of(recipe) if machine_caches(m) else None
        if ck is not None and fk is None:
            hit = CACHE.get(ck)
            if hit is not None:   # the machine's output on these data is known: upstream of it need not run
                self.n_hits += 1
                return self.add(kind="eval", fn=partial(_cached, hit), deps=(), node=x, machine=m, cost=0.0,
                                device=dev, label=f"{x._short()} (cached)", recipe=((), ck))
        if fk is not None and self._training_output(x, m, fk):
            fn = _training_output if ck is None else partial(_store, ck, owner, self.budget, _training_output)
            return self.add(kind="eval", fn=fn, deps=(fk,), node=x, machine=m, cost=1.0, device=dev, recipe=recipe)
        if fk is not None:
            deps.append(fk)  # the fitted estimator arrives as the last input
            fn = partial(_apply_fitted, x.operation, tuple(run))
        else:
            fn = partial(_apply_state, x.operation, tuple(run), st)   # st.estimator: fetched only where it runs
        if ck is not None:
            fn = partial(_store, ck, owner, self.budget, fn)
        return self.add(kind="eval", fn=fn, deps=tuple(deps), node=x, machine=m, cost=2.0, device=dev,
                        recipe=recipe)

    def key_of(self, recipe: tuple[tuple[int, ...], Any]) -> bytes | None:
        """The cache key of a value made by ``recipe`` (its inputs' tasks, its own part); None: not keyed.

        Inputs' keys are made on demand, each once, iteratively (no recursion limit on long chains).
        """
        deps, head = recipe
        memo, recipes = self.ckeys, self.recipes
        stack = [d for d in deps if d not in memo]
        while stack:
            k = stack[-1]
            if k in memo:
                stack.pop()
                continue
            r = recipes.get(k)
            if r is None:
                memo[k] = None
                stack.pop()
                continue
            todo = [d for d in r[0] if d not in memo]
            if todo:
                stack.extend(todo)
                continue
            memo[k] = _combine(r, memo)
            stack.pop()
        return _combine(recipe, memo)

    def prune(self, outputs: tuple[int, ...]) -> dict[int, int]:
        """Drop the tasks that only fed values now taken from the cache; the old key -> new key map.

        Sources stay (they cost nothing and tell a call the type of the data given).
        """
        tasks = self.tasks
        need = bytearray(len(tasks))
        stack = list(outputs)
        while stack:
            k = stack.pop()
            if not need[k]:
                need[k] = 1
                stack.extend(tasks[k].deps)
        remap: dict[int, int] = {}
        kept: list[Task] = []
        for t in tasks:
            if need[t.key] or t.kind == "source":
                remap[t.key] = len(kept)
                t.key = len(kept)
                t.deps = tuple(remap[d] for d in t.deps)
                kept.append(t)
        self.tasks = kept
        return remap

    def _machine_value(self, x: Node, m: "Machine", fk: int | None, st: Any, dev: Any) -> int:
        """The task giving ``gn.node(f, mach)`` its :class:`FittedMachine` (a snapshot, no data, no graph).

        From the fit task when ``m`` trains in this plan, else from the state read now: on every
        executor ``f`` receives the same kind of object, built where it runs, and moved like any value
        to the device where ``f`` runs (:meth:`FittedMachine.on`).
        """
        if fk is not None:
            fn: Callable[..., Any] = partial(view_of_fit, m.label, m.model, self.fit_action[m._uid])
            key = self.add(kind="eval", fn=fn, deps=(fk,), node=x, machine=m, cost=0.0, device=dev)
        else:
            fn = partial(FittedMachine, m.label, m.model, st.estimator, state_report(st))
            key = self.add(kind="eval", fn=fn, deps=(), node=x, machine=m, cost=0.0, device=dev)
        return key

    def _training_output(self, x: Node, m: "Machine", fk: int) -> bool:
        """Is ``x`` ``m.transform`` of ``m``'s own training input, in the plan that fits ``m``?

        Then ``m``'s fit task calls ``fit_transform`` (scikit-learn's contract:
        the same answer as ``fit(X, y).transform(X)``, often cheaper) and ``x``
        takes its result instead of transforming the training rows again.
        """
        if x.operation != "transform" or len(x._args) != 1 or not m.args or x._args[0] is not m.args[0]:
            return False
        est, n_args, resolved = self.fit_args[m._uid]
        if not callable(getattr(est, "fit_transform", None)):
            return False
        task = self.tasks[fk]
        if task.fn.func is not _fit_task and task.fn.func is not _fit_transform_task:
            return False              # a static machine, or a warm update by partial_fit
        if task.fn.func is not _fit_transform_task:
            task.fn = partial(_fit_transform_task, est, n_args, resolved, **task.fn.keywords)
        return True

    def _check_in_step(self, m: Any, st: Any) -> None:
        """Record ``m``'s state for this call; note it if an upstream machine was retrained since ``m``'s fit.

        Compared with the states this call uses (taken in dependency order), else the current ones: a call
        never mixes the states of two fits (MLJ's rule).  Frozen machines keep their state on purpose.
        """
        self.states[m._uid] = st
        if m.frozen:
            return
        behind = []
        for p, version in st.parents:
            used = self.states.get(p._uid)
            now = used.version if used is not None else p._version
            if now != version:
                behind.append(p)
        if behind:
            self.stale.append((m, behind))

    def raise_if_stale(self) -> None:
        if not self.stale:
            return
        ms = [m for m, _ in self.stale] + [p for _, ps in self.stale for p in ps]
        lab = labels(list(dict.fromkeys(ms)))
        parts = [f"{lab[m]} (trained before {', '.join(lab[p] for p in ps)} retrained)" for m, ps in self.stale]
        msg = (f"Machines out of step with their upstream machines: {'; '.join(parts)}. Their fitted states "
               "come from different fits (a fit failed part-way, or is running in another thread), so the "
               "network's answer would mix them. Call fit() on the node to bring them in step (only they and "
               "what depends on them retrain), or wait for the running fit to finish.")
        raise NotFittedError(msg)

    def _op_device(self, x: Node) -> Any:
        """Where operation node ``x`` runs (docs/devices.md, "Operation nodes follow their inputs").

        A host-only operation (:func:`~gpunets.devices.host_only`) runs on the CPU, always; then an
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


def _combine(recipe: tuple[tuple[int, ...], Any], memo: dict[int, bytes | None]) -> bytes | None:
    deps, head = recipe
    if callable(head):
        head = head()
    if head is None:
        return None
    parts = [head]
    for d in deps:
        k = memo[d]
        if k is None:
            return None
        parts.append(k)
    return digest(*parts)


def _source_head(s: Source, rows: Any) -> bytes:
    """A source's part of a cache key: its data's content and the rows taken (uid-free)."""
    r = b"all" if rows is None else repr(rows).encode() if isinstance(rows, slice) else value_key(rows)
    return digest(b"source", value_key(s._data), r)


def _constants_key(spec: tuple[tuple[bool, Any], ...] | list[tuple[bool, Any]]) -> bytes:
    return digest(*[b"node" if is_dep else value_key(v) for is_dep, v in spec])


def _function_head(op: Any, spec: tuple[tuple[bool, Any], ...]) -> bytes | None:
    name = operation_key(op)
    return None if name is None else digest(b"fn", name, _constants_key(spec))


def _cached(value: Any) -> Any:
    return value


def _store(key: bytes, owner: int, budget: int, fn: Callable[..., Any], *values: Any) -> Any:
    value = fn(*values)
    CACHE.put(key, value, budget=budget, owner=owner)
    return value


def _constant_on(value: Any, dev: Any) -> Any:
    """An array constant of an operation node (``W @ np.ones(2)``), moved once per plan to where the node runs.

    CuPy refuses NumPy operands in device operations, so weights, masks or offsets given as NumPy arrays go to the
    node's device with the node's other inputs; other constants (numbers, strings, slices) are used as they are.
    """
    if (isinstance(value, np.ndarray) or is_cupy_array(value)) and not same_device(device_of(value), dev):
        return to_device(value, dev, frames="array")
    return value


def _call_with_constants(fn: Callable[..., Any], spec: tuple[tuple[bool, Any], ...], *values: Any) -> Any:
    return fn(*[values[i] if is_dep else i for is_dep, i in spec])


def _apply_state(op: str, spec: tuple[tuple[bool, Any], ...], st: Any, *values: Any) -> Any:
    """Apply a machine's fitted state ``st`` (a :class:`~gpunets.machines.FittedState`)."""
    return apply_estimator(st.estimator, op, tuple(values[i] if is_dep else i for is_dep, i in spec), st.path)


def _apply_fitted(op: str, spec: tuple[tuple[bool, Any], ...], *values: Any) -> Any:
    est, info = values[-1][:2]       # a fit task's value: (estimator, info[, training output])
    return apply_estimator(est, op, tuple(values[i] if is_dep else i for is_dep, i in spec),
                           info.get("path", "sklearn"))


def _move(dev: Any, frames: str, value: Any) -> Any:
    if isinstance(value, FittedMachine):   # gn.node(f, mach): its fitted params follow f to ``dev``
        return value.on(dev)
    return to_device(value, dev, frames=frames)


def _resolve_fit(b: "_Builder", m: "Machine", pending: Any, deps: Sequence[int] = ()) -> Any:
    """Where machine ``m`` trains and as which estimator (None: the CPU clone as it is).

    A machine placed by default (no ``device=``, no block: ``"auto"``) whose training data no GPU
    array can hold (sparse, strings: :func:`~gpunets.value_types.host_only`) trains on the CPU, as the
    data decide (docs/devices.md); an explicit GPU placement of such data stays an error.
    """
    what = f"machine {m.label}"
    dev = b.placed(m.device, what, owner=m)
    if dev.is_cuda and _placed_by_default(m.device) and (
            any(host_only(s._data) for s in _raw_sources(m)) or is_frozen_estimator(pending.estimator)):
        dev = CPU   # host-only data, or a FrozenEstimator: its fitted state is the host object it wraps
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


def _raw_sources(m: "Machine") -> list[Source]:
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


def _fit_task(est: Any, n_args: int, resolved: Any, *values: Any, keywords: tuple[str, ...] = (),
              weights: Any = None) -> tuple[Any, dict[str, Any]]:
    check_weight_values(weights, values)
    return fit_estimator(est, tuple(values[:n_args]), resolved, keywords=keywords)


def _partial_fit_task(est: Any, n_args: int, resolved: Any, times: int, *values: Any,
                      keywords: tuple[str, ...] = (), weights: Any = None) -> tuple[Any, dict[str, Any]]:
    check_weight_values(weights, values)
    return partial_fit_estimator(est, tuple(values[:n_args]), resolved, times, keywords=keywords)


def _static_task(est: Any, resolved: Any) -> tuple[Any, dict[str, Any]]:
    return static_estimator(est, resolved)


def _static_state(m: "Machine") -> Any:
    """The state a call uses for a static machine that was never fitted: a fresh copy of its model, not kept."""
    pending = m._prepare_fit(STATIC, None, b"")
    return FittedState(pending.estimator, pending.params, None, b"", 0, STATIC, 0.0)


def _warm_route_ok(m: "Machine", dev: Any, path: str) -> bool:
    """A warm update continues only where its fitted state lives: the same device and route as its last fit."""
    st = m._state
    return st is not None and st.path == path and st.device == str(dev)


def _fit_transform_task(est: Any, n_args: int, resolved: Any, *values: Any, keywords: tuple[str, ...] = (),
                        weights: Any = None) -> tuple[Any, dict[str, Any], Any]:
    check_weight_values(weights, values)
    return fit_transform_estimator(est, tuple(values[:n_args]), resolved, keywords=keywords)


def _fit_keywords(m: "Machine") -> dict[str, Any]:
    """The keyword arguments of ``m``'s fit task: its keyword training arguments' names, and the check of
    its sample weights' rows where it could not be made now (:func:`gpunets.weights.check_weight_rows`)."""
    out: dict[str, Any] = {}
    if m.fit_keywords:
        out["keywords"] = m.fit_keywords
    pending = check_weight_rows(m, lambda s: s.data)   # all rows: fit(rows=...) must not hide a mismatch
    if pending is not None:
        out["weights"] = (*pending, m.label)
    return out


def _training_output(fitted: tuple[Any, ...]) -> Any:
    return fitted[2]


def _commit_fit(m: "Machine", pending: Any, asked: str, est: Any, info: dict[str, Any], *output: Any) -> None:
    dev = str(info.get("device", "cpu"))
    if dev.startswith("cuda"):
        # a committed state is read at once by calls in other threads, on their own streams, with no event to
        # wait for: its arrays must be complete before it is installed (the fit's stream, synchronised here)
        cp = loaded_cupy()
        if cp is not None:
            with cp.cuda.Device(local_ordinal(Device.parse(dev).index or 0)):
                cp.cuda.get_current_stream().synchronize()
    m._commit(pending, est, {**info, "asked": asked})


def _asked(spec: Any) -> str:
    """The placement asked for a machine: its own ``device=``, else a block's (a composite's ``device``
    included), else the configured one; ``"auto"`` when none asks (the report's ``asked`` column)."""
    for level in (spec, placement_override(), current_placement(), get_config().get("device")):
        if level is not None and not (isinstance(level, str) and level.strip().lower() == "auto"):
            return str(level if isinstance(level, str) else level)
    return "auto"


def _rows_key(rows: Any, n: int | None = None) -> Any:
    """The rows a fit trains on, by value: ``slice(0, 10)``, ``np.arange(10)`` and a mask give one key.

    With ``n`` (the number of rows of the data) rows become positions, in the order given; without it
    (no data known) a slice stays a slice.  ``rows=None`` stays distinct from every row listed (MLJ's rule).
    """
    if rows is None:
        return None
    import numpy as np

    if n is None:
        return rows if isinstance(rows, slice) else np.asarray(rows).copy()
    if isinstance(rows, slice):
        idx = np.arange(n)[rows]
    else:
        r = np.asarray(rows)
        idx = np.flatnonzero(r) if r.dtype == bool else np.where(r < 0, r + n, r).astype(np.int64, copy=False)
    return np.asarray(idx, dtype=np.int64)


def _n_rows_of(machines: Sequence[Any]) -> int | None:
    """The number of rows of the first source with data that the machines train on."""
    for m in machines:
        for s in machine_sources(m):
            if s._data is not None:
                try:
                    return n_rows(s._data)
                except Exception:  # noqa: BLE001 - a value without rows: compare rows as given
                    return None
    return None


def compile_fit(targets: Sequence[Any], *, rows: Any = None, force: bool = False,
                max_lanes: int | None = None, only: bool = False, cache: bool = False) -> Plan:
    """The plan that trains every machine upstream of ``targets`` (nodes or machines).

    With ``only=True`` the targets must be machines, and only they train (MLJ's ``fit_only!``):
    their upstream values are computed with the upstream machines' current fitted states.
    With ``cache=True`` machines that keep their outputs (:mod:`gpunets.cache`) take them from the
    cache and store them.
    """
    if only:
        _check_only(targets)
    with scope():   # each source's data is fingerprinted once per fit
        return _compile_fit(targets, rows=rows, force=force, max_lanes=max_lanes, only=only, cache=cache)


def _check_only(targets: Sequence[Any]) -> None:
    """``fit(only=True)``: every target a machine, every machine upstream of them fitted (else a clear error)."""
    bad = [t for t in targets if not isinstance(t, Machine)]
    if bad:
        msg = (f"fit(only=True) trains machines alone, so its targets must be machines; got {bad[0]!r} of type "
               f"{type(bad[0]).__name__}. Hint: mach.fit(only=True), or fit the node without only=True.")
        raise TypeError(msg)
    own = {t._uid for t in targets}
    missing = [m for m in upstream_machines([a for t in targets for a in t.args])
               if m._uid not in own and m._state is None and not m.static]
    if missing:
        names = ", ".join(labels(missing).values())
        what = ", ".join(t.label for t in targets)
        msg = (f"fit(only=True) trains {what} alone on the values its upstream machines compute with their fitted "
               f"states, but these upstream machines are not fitted: {names}. Hint: fit without only=True "
               "(mach.fit()) to train them too, or fit them first.")
        raise NotFittedError(msg)


def _compile_fit(targets: Sequence[Any], *, rows: Any, force: bool, max_lanes: int | None,
                 only: bool = False, cache: bool = False) -> Plan:

    nodes: list[AbstractNode] = []
    extra: list[Machine] = []
    for t in targets:
        if isinstance(t, Machine):
            extra.append(t)
            nodes.extend(t.args)
        elif is_node(t):
            nodes.append(t)
        else:
            msg = f"gn.fit takes nodes or machines; got {t!r} of type {type(t).__name__}."
            raise TypeError(msg)
    machines = [] if only else list(upstream_machines(nodes))
    seen = {m._uid for m in machines}
    for m in extra:
        if m._uid not in seen:
            machines.append(m)
            seen.add(m._uid)
    rows_key = _rows_key(rows, _n_rows_of(machines) if rows is not None else None)
    if cache and not get_config()["cache"]:
        cache = any(getattr(m, "cache", None) for m in machines)   # keys cost a little: only when some machine keeps outputs
        CACHE.requested = CACHE.requested or cache
    actions: dict[Any, str] = {}
    # One memoised walk answers every machine's questions about its upstream (linear in the network).
    up = Upstream(lambda p: actions.get(p, "skip"))
    for m in machines:
        actions[m] = m._decide(rows_key, force, up.changing(m), upstream=up)
    b = _Builder(rows=rows, bindings={}, mode="fit", cache=cache)
    # Every source is validated here (no data, rows out of range) before anything runs.
    for m in machines:
        if actions[m] == "skip":
            continue
        pending_deps = [b.node(a) for a in m.args]
        pending = m._prepare_fit(actions[m], rows_key, up.stamp(m, expected=True), up.parents(m, expected=True))
        resolved, dev, path = _resolve_fit(b, m, pending, pending_deps)
        if pending.warm is not None and not _warm_route_ok(m, dev, path):
            # it would run elsewhere than its fitted state (another device or route): refit a fresh clone
            actions[m] = "update"
            pending = m._prepare_fit("update", rows_key, up.stamp(m, expected=True), up.parents(m, expected=True))
            resolved, dev, path = _resolve_fit(b, m, pending, pending_deps)
        if pending.action != actions[m]:
            actions[m] = pending.action
        est = resolved.estimator if resolved is not None else pending.estimator
        frames = "array" if path == "array_api" else "auto"
        deps = [b.moved(k, dev, frames) for k in pending_deps]
        b.mach_dev[m._uid] = (dev, path)
        b.fit_args[m._uid] = (est, len(deps), resolved)
        b.fit_action[m._uid] = actions[m]
        if actions[m] == STATIC:
            fn = partial(_static_task, est, resolved)
        elif pending.warm is not None and pending.warm[0] == "partial_fit":
            fn = partial(_partial_fit_task, est, len(deps), resolved, pending.warm[1], **_fit_keywords(m))
        else:
            fn = partial(_fit_task, est, len(deps), resolved, **_fit_keywords(m))
        key = b.add(kind="fit", label=f"fit {m.label}", fn=fn,
                    deps=tuple(deps), machine=m, cost=10.0, commit=partial(_commit_fit, m, pending, _asked(m.device)), device=dev)
        b.fit_key[m._uid] = key
    if b.n_hits:
        remap = b.prune(tuple(b.fit_key.values()))
        b.fit_key = {u: remap[k] for u, k in b.fit_key.items()}
    return Plan("fit", b.tasks, tuple(b.fit_key.values()), actions, max_lanes, sklearn_config=sklearn_config_delta())


def compile_call(targets: Sequence[AbstractNode], bindings: dict[int, Any], *, rows: Any = None,
                 max_lanes: int | None = None, cache: bool = False) -> Plan:
    """The plan that evaluates ``targets`` with origins replaced by ``bindings`` (source uid -> data).

    With ``cache=True`` and no bindings (the training data), cached machine outputs are used and kept.
    """
    cache = cache and not bindings and (CACHE.requested or bool(get_config()["cache"]))
    b = _Builder(rows=rows, bindings=bindings, mode="call", cache=cache)
    if cache:
        with scope():
            outputs = tuple(b.node(t) for t in targets)
    else:
        outputs = tuple(b.node(t) for t in targets)
    b.raise_if_stale()
    if b.n_hits:
        remap = b.prune(outputs)
        outputs = tuple(remap[k] for k in outputs)
    return Plan("call", b.tasks, outputs, max_lanes=max_lanes, sklearn_config=sklearn_config_delta())


# How many lanes a task's clock remembers; with more lanes it keeps the latest ancestors (see assign_lanes).
CLOCK_LIMIT = 64


def assign_lanes(plan: Plan, max_lanes: int | None = None) -> int:
    """Tag each runnable task with a lane (GrCUDA's stream-assignment policy).

    Source tasks are known before the run and take no lane (``-1``).

    A task other than its parent's first child takes a *free* lane, one whose last
    task is among its ancestors.  That is answered with a vector clock rather than
    ancestor sets: each task keeps, for each lane, the latest of its ancestors on
    that lane (the merge of its dependencies' clocks), and a lane is free exactly
    when that latest ancestor is the lane's last task.  A clock lives only until
    every consumer of its task has been placed, and holds at most
    :data:`CLOCK_LIMIT` lanes (the latest ancestors; with ``max_lanes`` up to
    that, the answer is exact).  Forgetting an ancestor can only call a free lane
    busy, which costs concurrency, never correctness: executors order every
    cross-lane edge (the streams executor waits on the producer's event) and run
    each lane in plan order.  Memory is bounded by the tasks in flight, not the plan.
    """
    tasks = plan.tasks
    clocks: list[dict[int, int] | None] = [None] * len(tasks)   # lane -> latest ancestor key on it
    left = [len(c) for c in plan.consumers]                       # consumers not placed yet
    lane_last: list[int] = []         # last task key on each lane
    lane_load: list[float] = []
    inherited = bytearray(len(tasks))  # parents whose first child already took their lane
    for t in tasks:
        if t.kind == "source":
            continue
        clock: dict[int, int] = {}
        lane = -1
        for d in t.deps:
            parent = tasks[d]
            if parent.kind == "source":
                continue
            for ln, k in clocks[d].items():  # type: ignore[union-attr]
                if clock.get(ln, -1) < k:
                    clock[ln] = k
            if clock.get(parent.lane, -1) < d:
                clock[parent.lane] = d
            left[d] -= 1
            if left[d] == 0:
                clocks[d] = None
            if lane < 0 and not inherited[d]:
                inherited[d] = 1
                lane = parent.lane
        if len(clock) > CLOCK_LIMIT:  # keep the latest ancestors
            clock = dict(sorted(clock.items(), key=lambda kv: kv[1])[-CLOCK_LIMIT:])
        if lane < 0:
            free = [ln for ln, k in clock.items() if lane_last[ln] == k]
            if free:
                lane = min(free, key=lambda i: (lane_load[i], i))
            elif max_lanes is None or len(lane_last) < max_lanes:
                lane = len(lane_last)
                lane_last.append(t.key)
                lane_load.append(0.0)
            else:
                lane = min(range(len(lane_last)), key=lambda i: lane_load[i])
        t.lane = lane
        lane_last[lane] = t.key
        lane_load[lane] += t.cost
        if left[t.key]:
            clocks[t.key] = clock
    plan._n_lanes = len(lane_last)
    return plan._n_lanes

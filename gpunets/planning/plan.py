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

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gpunets.base.config import get_config
from gpunets.base.exceptions import NotFittedError
from gpunets.compute.estimators import sklearn_config_delta
from gpunets.core.fitted_machine import MACHINE_VALUE, FittedMachine, state_report, view_of_fit
from gpunets.core.graph import Upstream, op_nodes, upstream_machines
from gpunets.core.machines import STATIC, Machine, labels
from gpunets.core.nodes import AbstractNode, Node, Source, is_node
from gpunets.devices.cache import CACHE, digest, machine_caches, token
from gpunets.devices.data import device_of
from gpunets.devices.fingerprint import scope
from gpunets.devices.placement import CPU, Device
from gpunets.planning.lanes import (
    assign_lanes,
)
from gpunets.planning.outputs import cached_operation, own_training_output, recomputed_output
from gpunets.planning.placement import (
    PlacementRules,
    _asked,
    _fit_keywords,
    _resolve_fit,
    _warm_route_ok,
)
from gpunets.planning.stored import STORED, StoreKeys, commit_and_store, lookup, storable, stored_task
from gpunets.planning.tasks import (  # noqa: F401 - also here, their path in files saved before the split
    _apply_fitted,
    _apply_state,
    _cached,
    _call_with_constants,
    _combine,
    _commit_fit,
    _constant_on,
    _constants_key,
    _fit_task,
    _fit_transform_task,
    _function_head,
    _move,
    _n_rows_of,
    _partial_fit_task,
    _rows_key,
    _source_head,
    _static_state,
    _static_task,
    _store,
    _training_output,
)

__all__ = ["Task", "Plan", "compile_fit", "compile_call", "assign_lanes"]


class Task:
    """One unit of work in a plan (its label is computed only when asked for)."""

    __slots__ = ("key", "kind", "_label", "fn", "deps", "lane", "device", "node", "machine", "value", "cost",
                 "commit")

    def __init__(self, key: int, kind: str, fn: Callable[..., Any] | None, deps: tuple[int, ...] = (),
                 label: str | None = None, lane: int = -1, device: str = "cpu", node: AbstractNode | None = None,
                 machine: Machine | None = None, value: Any = None, cost: float = 1.0,
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
    stored_from: dict[Any, str] = field(default_factory=dict)   # machine -> a loaded GPU state's origin

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


class _Builder(PlacementRules):
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
        self.same_output: set[int] = set()           # loaded machines whose transform gives their training output
        self.moves: dict[tuple[int, Any, str], int] = {}
        self._placed: dict[Any, Any] = {}
        self.floating: set[int] = set()   # tasks of input-less nodes placed by default: they follow their consumers
        self._names: dict[Any, str] = {}             # Device -> its string, computed once
        self.states: dict[int, Any] = {}             # machine uid -> the fitted state this plan uses
        self.stale: list[tuple[Any, list[Any]]] = []  # (machine, upstream machines it is out of step with)
        # the cache of node outputs (gpunets.devices.cache): how each task's key is made, the keys made, the hits
        self.cache = cache
        self.recipes: dict[int, tuple[tuple[int, ...], Any]] = {}
        self.ckeys: dict[int, bytes | None] = {}
        self.n_hits = 0
        self.budget = int(get_config()["cache_bytes"]) if cache else 0


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
            if x._uid not in self.memo:           # (a node's task may build others first: planning.outputs)
                self.memo[x._uid] = self._make(x)
        return self.memo[n._uid]

    def _make(self, x: AbstractNode) -> int:
        if isinstance(x, Source):
            value = self._source_value(x)
            recipe: tuple[tuple[int, ...], Any] | None = None
            if self.cache:
                recipe = ((), partial(_source_head, x, self.rows))
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
                assert st is not None   # not fitted in this plan: it has a state, or NotFittedError was raised
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
            func = x.operation
            assert callable(func)   # Node() refuses an operation that is not callable without a machine
            fn = func if plain else partial(_call_with_constants, func, tuple(run))
            recipe = (tuple(deps), partial(_function_head, x.operation, tuple(spec))) if self.cache else None
            return self.add(kind="eval", fn=fn, deps=tuple(deps), node=x, cost=1.0, device=dev, recipe=recipe)
        op = x.operation
        assert isinstance(op, str)   # a machine's node names the machine's operation
        ck, owner, recipe = None, 0, None
        if self.cache:
            if fk is not None:
                est, version = self.fit_args[m._uid][0], m._version + 1
            else:
                assert st is not None   # not fitted in this plan: it has a state (checked above)
                est, version = st.estimator, st.version
            owner = token(est) or 0
            head = None if not owner else digest(
                b"op", str(owner).encode(), str(version).encode(),
                cached_operation(self.mode, x, m).encode(), f"{dev} {frames}".encode(), _constants_key(spec))
            recipe = (tuple(deps), head)
            ck = self.key_of(recipe) if machine_caches(m) else None
        if ck is not None and fk is None:
            hit = CACHE.get(ck)
            if hit is not None:   # the machine's output on these data is known: upstream of it need not run
                self.n_hits += 1
                return self.add(kind="eval", fn=partial(_cached, hit), deps=(), node=x, machine=m, cost=0.0,
                                device=dev, label=f"{x._short()} (cached)", recipe=((), ck))
        again = recomputed_output(self, x, m, fk, st, frames, ck, owner)
        if again is not None:
            return again
        if fk is not None and self._training_output(x, m, fk):
            fn = _training_output if ck is None else partial(_store, ck, owner, self.budget, _training_output)
            return self.add(kind="eval", fn=fn, deps=(fk,), node=x, machine=m, cost=1.0, device=dev, recipe=recipe)
        if fk is not None:
            deps.append(fk)  # the fitted estimator arrives as the last input
            fn = partial(_apply_fitted, op, tuple(run))
        else:
            fn = partial(_apply_state, op, tuple(run), st)   # st.estimator: fetched only where it runs
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

    def _machine_value(self, x: Node, m: Machine, fk: int | None, st: Any, dev: Any) -> int:
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

    def _training_output(self, x: Node, m: Machine, fk: int) -> bool:
        """Is ``x`` ``m.transform`` of ``m``'s own training input, in the plan that fits ``m``?

        Then ``m``'s fit task calls ``fit_transform`` (scikit-learn's contract:
        the same answer as ``fit(X, y).transform(X)``, often cheaper) and ``x``
        takes its result instead of transforming the training rows again.
        """
        if not own_training_output(x, m):
            return False
        est, n_args, resolved = self.fit_args[m._uid]
        if not callable(getattr(est, "fit_transform", None)):
            return False
        task = self.tasks[fk]
        fit = task.fn
        assert isinstance(fit, partial)   # a fit task calls a partial of one of the fit functions
        if fit.func is not _fit_task and fit.func is not _fit_transform_task:
            return False              # a static machine, or a warm update by partial_fit
        if fit.func is not _fit_transform_task:
            # with a store in force, the fit also checks whether its transform gives the same output (kept in the
            # entry: a loaded state then passes on its transform; gpunets.planning.outputs)
            task.fn = partial(_fit_transform_task, est, n_args, resolved, **fit.keywords,
                              check=get_config()["store"] is not None)
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


def compile_fit(targets: Sequence[Any], *, rows: Any = None, force: bool = False,
                max_lanes: int | None = None, only: bool = False, cache: bool = False,
                outputs: Sequence[AbstractNode] = ()) -> Plan:
    """The plan that trains every machine upstream of ``targets`` (nodes or machines).

    With ``only=True`` the targets must be machines, and only they train (MLJ's ``fit_only!``):
    their upstream values are computed with the upstream machines' current fitted states.
    With ``cache=True`` machines that keep their outputs (:mod:`gpunets.devices.cache`) take them from the
    cache and store them.  ``outputs``: nodes whose values on the training rows the plan also gives, after
    the fits' (a composite's ``fit_transform``): computed as the fits' inputs are, so a machine fitted in the
    plan passes on its ``fit_transform`` (:mod:`gpunets.planning.outputs`).
    """
    if only:
        _check_only(targets)
    with scope():   # each source's data is fingerprinted once per fit
        return _compile_fit(targets, rows=rows, force=force, max_lanes=max_lanes, only=only, cache=cache,
                            outputs=outputs)


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
                 only: bool = False, cache: bool = False, outputs: Sequence[AbstractNode] = ()) -> Plan:

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
    store = get_config()["store"]
    keys = StoreKeys(actions.get, b"all" if rows_key is None else _rows_bytes(rows_key)) if store is not None else None
    notes: dict[Machine, str] = {}   # where a stored state came from, when not a fit of this kind
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
        commit = partial(_commit_fit, m, pending, _asked(m.device))
        label = f"fit {m.label}"
        skey = None
        if keys is not None:
            if actions[m] in ("train", "update") and pending.warm is None and storable(est):
                skey = keys.fit_key(m, dev, path)
            elif pending.warm is not None and storable(est):
                skey = keys.warm_key(m, dev, path, pending.warm)   # a continued state: chained to the one it continues
            keys.set_machine(m, skey)
        gpu = b.fell_back(m.device, dev) if pending.warm is None else None   # a GPU twin: of cold fits only
        hit = lookup(store, keys, m, skey, gpu, "machine " + m.label) if keys and skey else None
        if skey is not None:
            pending = dataclasses.replace(pending, key=skey if hit is None else hit.key)
            commit = partial(_commit_fit, m, pending, _asked(m.device))
        if hit is not None:
            # stored: the state is loaded instead of fitted, and needs no training data (pruned below)
            assert keys is not None
            keys.set_machine(m, hit.key)   # a GPU state's twin: downstream keys name the GPU fit
            actions[m] = STORED
            notes[m] = hit.note
            pending = dataclasses.replace(pending, action=STORED)
            commit = partial(_commit_fit, m, pending, _asked(m.device))
            key = b.add(kind="fit", label=f"load {m.label} (stored)", fn=partial(stored_task, hit.estimator,
                        {**hit.info, "device": str(dev), "path": path}, None if hit.note else hit.key), deps=(),
                        machine=m, cost=0.0,
                        commit=commit, device=dev)
            b.mach_dev[m._uid] = (dev, path)
            b.fit_args[m._uid] = (hit.estimator, 0, None)
            b.fit_action[m._uid] = STORED
            if hit.info.get("same_output"):
                b.same_output.add(m._uid)
            b.fit_key[m._uid] = key
            b.n_hits += 1
            continue
        if skey is not None:
            commit = partial(commit_and_store, store, skey, commit)
        if actions[m] == STATIC:
            fn = partial(_static_task, est, resolved)
        elif pending.warm is not None and pending.warm[0] == "partial_fit":
            fn = partial(_partial_fit_task, est, len(deps), resolved, pending.warm[1], **_fit_keywords(m))
        else:
            fn = partial(_fit_task, est, len(deps), resolved, **_fit_keywords(m))
        key = b.add(kind="fit", label=label, fn=fn, deps=tuple(deps), machine=m, cost=10.0, commit=commit, device=dev)
        b.fit_key[m._uid] = key
    out_keys = tuple(b.node(n) for n in outputs)
    if b.n_hits:
        remap = b.prune(tuple(b.fit_key.values()) + out_keys)
        b.fit_key = {u: remap[k] for u, k in b.fit_key.items()}
        out_keys = tuple(remap[k] for k in out_keys)
    return Plan("fit", b.tasks, tuple(b.fit_key.values()) + out_keys, actions, max_lanes, sklearn_config=sklearn_config_delta(),
                stored_from={m: n for m, n in notes.items() if n})


def _rows_bytes(rows_key: Any) -> bytes:
    """The rows a fit takes, as a store key's part: positions (an array) or a slice."""
    if isinstance(rows_key, slice):
        return repr(rows_key).encode()
    return b"rows" + bytes(memoryview(rows_key).cast("B")) if hasattr(rows_key, "dtype") else repr(rows_key).encode()


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



"""Building the search network, one fold at a time, with equal machines merged.

Two shapes of candidate:

* **steps** (a scikit-learn ``Pipeline``, or any estimator as a single step): step ``i`` of two
  candidates is one fit when steps ``0..i`` are equal (:func:`~gpunets.tuning.tasks.step_key`);
* **composites** (gpunets composites and stacks): each candidate's own network is built on the fold's
  sources, then copied into the search network node by node, hash-consed: a machine is one fit when its
  model is equal and its training inputs are the same (already merged) nodes, an operation node is one
  node when its operation and inputs are the same.

Both return, per candidate, the node of its scores (one entry of scikit-learn's ``_fit_and_score`` output).
"""

from __future__ import annotations

import contextvars
from functools import partial
from typing import Any

import numpy as np
from sklearn.base import clone
from sklearn.pipeline import Pipeline
from sklearn.utils.validation import _check_method_params

from gpunets.compose._composite_ops import same_value
from gpunets.compose.composite import Composite
from gpunets.compute.models import resolve_estimator
from gpunets.core.fitted_machine import MACHINE_VALUE, view_of_estimator
from gpunets.core.graph import op_nodes, upstream_machines
from gpunets.core.nodes import AbstractNode, Node, Source, node
from gpunets.tuning import batched, batched_gpu, memory, tasks
from gpunets.tuning.memory import prefix_keys
from gpunets.tuning.report import SearchReport, batch_fit_name, fit_name

__all__ = ["CompositeFold", "StepsFold", "is_composite", "pipeline_steps"]

# scikit-learn's configuration of the search's caller (thread-local in scikit-learn), set while its folds are
# built: the tasks that call scikit-learn run under it on any executor's threads or workers, as joblib's do
SKLEARN_CONFIG: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("sklearn_config",
                                                                                       default=None)


def _sk(fn: Any) -> Any:
    cfg = SKLEARN_CONFIG.get()
    return fn if cfg is None else tasks.Configured(fn, cfg)


def pipeline_steps(est: Any) -> list[tuple[str, Any]] | None:
    """The steps of a plain Pipeline, passthrough steps dropped; None for other estimators."""
    if type(est) is not Pipeline:
        return None
    steps = [(name, s) for name, s in est.steps if s is not None and s != "passthrough"]
    if not steps or steps[-1][0] != est.steps[-1][0]:
        return None  # a passthrough final step: search the pipeline as one step
    return steps


def is_composite(est: Any) -> bool:
    return isinstance(est, Composite)


class StepsFold:
    """One fold of a search over candidates cut into steps; shared steps are fitted once.

    ``fit_params`` is ``{step name: that step's fit parameters, already cut to the fold's training rows}``
    (the same for every candidate, so a step with fit parameters is shared like any other);
    ``score_params`` ``(test, train)`` go to the scorer; ``device`` is the search's CUDA device, or None on
    the CPU (each step then runs on the route :func:`~gpunets.compute.models.resolve_estimator` gives it);
    ``batch``: last steps that a rule of :mod:`gpunets.tuning.batched` knows are fitted and scored together (off
    where callbacks watch each evaluation's own fit).
    """

    def __init__(self, report: SearchReport, folds: tuple[Any, ...], fit_params: dict[str, dict[str, Any]],
                 score_args: tuple[Any, ...], train_score: bool, score_params: Any = None,
                 device: Any = None, kept: Any = None, batch: bool = True) -> None:
        self.report, self.score_args, self.train_score = report, score_args, train_score
        self.batch = batch
        self.score_params, self.device = score_params, device
        # the search memory's fitted shared steps of this fold (memory.FoldSteps), or None
        self.kept = kept
        self.reused: set[Any] = set()               # step keys whose fit the memory gave
        # parameters cut to the fold's rows (sample weights...): one node each, so that a graph sent to Dask
        # holds them once per fold, not once per task that reads them
        # host data held by a node placed on the host, so that a step on a GPU gets them moved there
        self.fp = {name: node(tasks.constant, p, name=f"{name} fit parameters", device="cpu") if p else p
                   for name, p in fit_params.items()}
        self.Xtr, self.Xte, self.ytr, self.yte, self.n_test = folds
        self.shared: dict[Any, tuple[Any, ...]] = {}
        self.routes: dict[Any, Any] = {}
        self.pending: list[tuple[Any, ...]] = []   # per candidate: its last route, upstream Stage node, step keys
        self.users: dict[Any, int] = {}            # step key -> candidates of this fold that use the step
        self.last: dict[Any, tuple[str, Any]] = {}  # last step's key -> (its name, its estimator)

    def _route(self, name: str, est: Any) -> Any:
        if self.device is None:
            return None
        k = tasks.step_key(est)
        if k not in self.routes:
            self.routes[k] = resolve_estimator(est, self.device, what=f"search step {name!r}")
        return self.routes[k]

    def candidate(self, steps: list[tuple[str, Any]], warm: tuple[Any, str, int] | None = None,
                  keys: list[Any] | None = None) -> None:
        """Add one candidate's steps (its last step and score are made by :meth:`scores`, once all are known).

        Each upstream step is one task (:func:`~gpunets.tuning.tasks.fit_stage`): it fits, transforms the
        test rows (and the training rows to score) and passes on a :class:`~gpunets.tuning.tasks.Stage`;
        the deepest one already in this fold's network or kept by the search's memory is not fitted again.
        ``warm`` (an iteration budget warm-started, :mod:`gpunets.tuning.warm`): ``(the candidate's fitted
        last step of the previous rung or None, the budget's parameter, the threads its fit may use)``; its
        last step is then a task of its own that continues that fit and returns it with the scores.  ``keys``: the steps' keys
        (:func:`~gpunets.tuning.memory.prefix_keys`), computed once per candidate for all folds.
        """
        keys = prefix_keys(steps) if keys is None else keys
        stage, start = self._deepest(steps, keys)   # the previous upstream step's node; None before the first
        route = None
        for i in range(start, len(steps)):
            name, est = steps[i]
            key = keys[i]
            route = self._route(name, est)
            if i == len(steps) - 1:   # the last step: one fit per distinct step, made by scores()
                if warm is not None:   # one fit per candidate, which continues its own previous fit
                    self.report.fits[name] += 1
                    self.report.warm += warm[0] is not None
                    self.last.setdefault(key, (name, est))
                elif key not in self.last:
                    self.last[key] = (name, est)   # the search's own copy (a clone per candidate): never fitted
                    self.report.fits[name] += 1
                break
            inputs = ((stage,) if stage is not None
                      else (self.Xtr, self.Xte, self.Xtr if self.train_score else None))
            fn = _sk(tasks.fit_stage)
            if self.kept is not None:
                fn = self.kept.keeping(key, fn)
            stage = self.shared[key] = node(fn, clone(est), route, self.fp.get(name, {}), self.train_score,
                                            self.ytr, *inputs, name=fit_name(name))
            self.report.fits[name] += 1
            self.report.transforms += 1
        for k in keys:
            self.users[k] = self.users.get(k, 0) + 1
        self.pending.append((route, stage, keys, warm))

    def _deepest(self, steps: list[tuple[str, Any]], keys: list[Any]) -> tuple[Any, int]:
        """``(the node of the deepest upstream step fitted already, the index of the next step)``: one of
        this fold's network, or one the search's memory kept (its fit, and those of the steps before it,
        counted in ``report.reused``); ``(None, 0)`` when there is none."""
        for i in range(len(steps) - 2, -1, -1):
            hit = self.shared.get(keys[i])
            if hit is None and self.kept is not None:
                value = self.kept.get(keys[i])
                if value is not None:
                    for j in range(i + 1):   # its fit and those before it, unless this fold's network has them
                        if keys[j] not in self.shared and keys[j] not in self.reused:
                            self.reused.add(keys[j])
                            self.report.reused[steps[j][0]] = self.report.reused.get(steps[j][0], 0) + 1
                    hit = self.shared[keys[i]] = node(tasks.constant, value, name=f"kept {steps[i][0]}")
            if hit is not None:
                return hit, i + 1
        return None, 0

    def scores(self) -> list[AbstractNode]:
        """The score node of every candidate added, in order (fit times shared out among the users).

        A last step that one candidate of the fold uses is fitted and scored in one task (nothing but
        its scores leaves the task); a last step several candidates share (equal candidates) is one fit
        whose result each candidate's score reads.
        """
        scorer, error_score, n_scores = self.score_args
        head: Any = (scorer, error_score, self.train_score, self.n_test, n_scores, self.score_params)
        if self.score_params is not None:   # sample weights of the fold's rows: once per fold (see __init__)
            head = node(tasks.constant, head, name="score parameters")
        ytr = self.ytr if self.train_score else None
        fits: dict[Any, AbstractNode] = {}
        out: list[AbstractNode] = []
        together = self._batches(head, ytr) if self.batch else {}
        for i, (route, stage, keys, warm) in enumerate(self.pending):
            if i in together:
                out.append(together[i])
                continue
            name, est = self.last[keys[-1]]
            users = tuple(self.users[k] for k in keys)
            X, X_test, X_train = ((stage, None, None) if stage is not None
                                  else (self.Xtr, self.Xte, self.Xtr if self.train_score else None))
            fp = self.fp.get(name, {})
            if warm is not None:
                from gpunets.tuning.warm import warm_fit_and_score  # lazy: warm imports this module

                users = (*users[:-1], 1)
                out.append(node(_sk(warm_fit_and_score), est, warm[0], warm[1], route, fp, X, self.ytr, users, head,
                                X_test, self.yte, X_train, ytr, warm[2], name=fit_name(name)))
                continue
            if self.users[keys[-1]] == 1:
                out.append(node(_sk(tasks.fit_and_score), est, route, fp, X, self.ytr, users, head, X_test, self.yte,
                                X_train, ytr, name=fit_name(name)))
                continue
            step = fits.get(keys[-1])
            if step is None:
                step = fits[keys[-1]] = node(_sk(tasks.fit_step), est, route, True, fp, X, self.ytr, name=fit_name(name))
            out.append(node(_sk(tasks.score_fit), route, users, head, step, X if stage is not None else X_test,
                            self.yte, X_train, ytr))
        return out

    def _batches(self, head: Any, ytr: Any) -> dict[int, AbstractNode]:
        """``{index of a pending candidate: its score node}`` for the candidates whose last steps one rule of
        :mod:`gpunets.tuning.batched` fits together: two or more on the same upstream node, each its own fit
        (no equal candidate, no warm start, no fit parameters), on the CPU or, on a GPU, on the array-API route
        (:mod:`gpunets.tuning.batched_gpu`)."""
        groups: dict[Any, list[int]] = {}
        for i, (route, stage, keys, warm) in enumerate(self.pending):
            name, est = self.last[keys[-1]]
            if warm is not None or self.users[keys[-1]] != 1 or self.fp.get(name):
                continue
            # on a GPU: the array-API route's rules (tuning.batched_gpu), fitted as the route's estimator
            found = batched.rule_for(est) if route is None else batched_gpu.rule_for(route.estimator, route)
            if found is not None:
                where = None if route is None else str(route.device)
                groups.setdefault((id(stage), name, found, where), []).append(i)
        out: dict[int, AbstractNode] = {}
        for (_, name, (rule, _), where), members in groups.items():
            if len(members) < 2:
                continue
            stage = self.pending[members[0]][1]
            X, X_test, X_train = ((stage, None, None) if stage is not None
                                  else (self.Xtr, self.Xte, self.Xtr if self.train_score else None))
            users = tuple(tuple(self.users[k] for k in self.pending[i][2]) for i in members)
            if where is None:
                ests = tuple(self.last[self.pending[i][2][-1]][1] for i in members)
                both = node(_sk(batched.fit_and_score_batch), rule, ests, users, head, X, self.ytr, X_test,
                            self.yte, X_train, ytr, name=batch_fit_name(name, len(members)))
            else:
                routes = tuple(self.pending[i][0] for i in members)
                both = node(_sk(batched_gpu.fit_and_score_batch), rule, routes, users, head, X, self.ytr, X_test,
                            self.yte, X_train, ytr, name=batch_fit_name(name, len(members)))
            for j, i in enumerate(members):
                out[i] = node(batched.pick, both, j, name=f"score {name}")
        return out


class CompositeFold:
    """One fold of a search over composites: each candidate's network copied in, equal machines merged."""

    def __init__(self, report: SearchReport, data: tuple[Any, ...], score_args: tuple[Any, ...],
                 train_score: bool) -> None:
        self.report, self.score_args, self.train_score = report, score_args, train_score
        self.Xtr, self.ytr, self.Xte, self.yte = data
        self.sources: dict[str, Any] = {}          # validated training data -> the fold's sources
        self.memo: dict[Any, AbstractNode] = {}    # structural key -> node of the search network
        self.copies: dict[int, AbstractNode] = {}  # (context, uid) of a candidate's node -> its copy
        self.pending: list[Any] = []               # per candidate: its score's arguments and machine keys
        self.users: dict[Any, int] = {}            # machine key -> candidates of this fold that use it
        self.needed: set[Any] = set()              # machine keys the candidate being copied uses
        self.frozen: dict[int, Any] = {}           # id of a machine of that candidate -> its frozen machine

    def _sources(self, spec: Any) -> tuple[Source, Source, Source]:
        spec._gn_check_params(self.Xtr, self.ytr)
        Xo, yo = spec._gn_validate_fit(self.Xtr, self.ytr)
        Xv = spec._gn_validate_call(self.Xte, "predict")
        for have in self.sources.values():
            if all(a is b or same_value(a, b) for a, b in zip(have[0], (Xo, yo, Xv))):
                return have[1]
        srcs = (Source(Xo, name="X"), Source(yo, name="y"), Source(Xv, name="X"))
        self.sources[len(self.sources)] = ((Xo, yo, Xv), srcs)
        return srcs

    def candidate(self, spec: Any) -> None:
        """Add one candidate's network (its score node is made by :meth:`scores`, once all are known)."""
        scorer, error_score, n_scores = self.score_args
        try:
            sx, sy, ste = self._sources(spec)
            outputs = spec._gn_build({"X": sx, "y": sy})
        except Exception as e:  # noqa: BLE001 - the candidate fails, the others run
            import traceback

            failed = tasks.Failed(e, traceback.format_exc())
            self.pending.append(node(_sk(tasks.score_one), scorer, error_score, self.train_score, len(self.yte),
                                     n_scores, None, failed, None, None, None, None))
            return
        machines = upstream_machines(list(outputs.values()))
        for m in machines:
            self.report.naive[m.label] = self.report.naive.get(m.label, 0) + 1
        # components frozen in the searched composite (``freeze=``, ``machines_[name].freeze()``) come with
        # the candidate (a clone carries them, as scikit-learn's clone of a FrozenEstimator): kept, never refitted
        carried = spec._gn_frozen_components()
        names = spec._gn_names(machines) if carried else {}
        self.frozen = {id(m): carried[names[id(m)]] for m in machines
                       if names.get(id(m)) in carried and carried[names[id(m)]].is_fitted}
        ops = tuple(op for op in tasks.Replay._OPS if op in outputs and op != "inverse_transform")
        test_env = {sx._uid: ste}
        self.needed = set()
        values = [self._copy(outputs[op], test_env) for op in ops]
        if self.train_score:
            values += [self._copy(outputs[op], {}) for op in ops]
        keys = tuple(self.needed)
        for k in keys:
            self.users[k] = self.users.get(k, 0) + 1
        self.pending.append(((spec, ops, scorer, error_score, self.train_score, len(self.yte), n_scores), keys,
                             (self.yte, self.ytr if self.train_score else None, *values)))

    def scores(self) -> list[AbstractNode]:
        """The score node of every candidate added, in order (fit times shared out among the users)."""
        out: list[AbstractNode] = []
        for p in self.pending:
            if isinstance(p, AbstractNode):
                out.append(p)
                continue
            head, keys, tail = p
            secs = node(tasks.share_seconds, tuple(self.users[k] for k in keys),
                        *(self.memo[("seconds", k)] for k in keys))
            out.append(node(_sk(tasks.score_replay), *head, secs, *tail))
        return out

    # --- copying a candidate's network into the search network, hash-consed ---------------------
    def _intern(self, key: Any, fn: Any, *args: Any, name: str | None = None) -> AbstractNode:
        """The node ``key`` names, made as ``node(fn, *args, name=name)`` the first time."""
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = node(fn, *args, name=name)
        return hit

    def _arg(self, a: Any, env: dict[int, AbstractNode], keys: list[Any]) -> Any:
        if isinstance(a, AbstractNode):
            c = self._copy(a, env)
            keys.append(("node", c._uid))
            return c
        keys.append(("const", tasks.step_key(a)))
        return a

    def _copy(self, n: AbstractNode, env: dict[int, AbstractNode]) -> AbstractNode:
        """``n`` in the search network, its op-edge sources replaced by ``env`` (machines train unchanged)."""
        ckey = (tuple(env.items()), n._uid)
        hit = self.copies.get(ckey)
        if hit is not None:
            return hit
        for x in _op_order(n):
            k = (tuple(env.items()), x._uid)
            if k in self.copies:
                continue
            if isinstance(x, Source):
                self.copies[k] = env.get(x._uid, x)
                continue
            assert isinstance(x, Node)
            keys: list[Any] = []
            args = [self._arg(a, env, keys) for a in x.args]
            if x.machine is not None and x.operation == MACHINE_VALUE:   # gn.node(f, mach): f gets a snapshot
                fit = self._machine(x.machine)
                self.copies[k] = self._intern(("machine", fit._uid), _sk(tasks.call_fn),
                                              partial(view_of_estimator, x.machine.label, x.machine.model), fit)
            elif x.machine is not None:
                fit = self._machine(x.machine)
                self.copies[k] = self._intern(("op", x.operation, fit._uid, tuple(keys)),
                                              _sk(tasks.apply_op), x.operation, fit, *args)
            else:
                self.copies[k] = self._intern(("fn", tasks.fn_key(x.operation), tuple(keys)),
                                              _sk(tasks.call_fn), x.operation, *args)
        return self.copies[ckey]

    def _machine(self, m: Any) -> AbstractNode:
        frozen = self.frozen.get(id(m))
        if frozen is not None:   # its fitted state, as the candidate carries it: no fit, no fit time
            key = ("frozen", frozen._uid, id(frozen))
            self.needed.add(key)
            fit = self._intern(key, tasks.frozen_model, frozen.estimator_, name=fit_name(m.label))
            self._intern(("seconds", key), tasks.seconds, fit)
            return self._intern(("fitted", key), tasks.fitted, fit)
        keys: list[Any] = []
        args = [self._arg(a, {}, keys) for a in m.args]
        key = ("machine", tasks.step_key(m.model), tuple(keys), m.fit_keywords)

        if key not in self.memo:
            self.report.fits[m.label] = self.report.fits.get(m.label, 0) + 1
        self.needed.add(key)
        fit = self._intern(key, _sk(partial(tasks.fit_model, keywords=m.fit_keywords)), clone(m.model), *args,
                           name=fit_name(m.label))
        self._intern(("seconds", key), tasks.seconds, fit)
        return self._intern(("fitted", key), tasks.fitted, fit)


def _op_order(n: AbstractNode) -> list[AbstractNode]:
    """Nodes reached from ``n`` through operation edges, dependencies first (no recursion)."""
    return op_nodes([n])


def fold_data(X: Any, y: Any, train: np.ndarray, test: np.ndarray) -> tuple[Any, Any, Any, Any]:
    """The fold's rows, selected now (composites validate them when their network is built)."""
    return tasks.take(X, train), tasks.take(y, train), tasks.take(X, test), tasks.take(y, test)


def fold_nodes(estimator: Any, kept: Any, hooked: bool, X: Any, y: Any, splits: list[tuple[np.ndarray, np.ndarray]],
               specs: list[Any], steps: Any, composite: bool, by_step: Any, score_params: dict[str, Any],
               weights: bool, score_args: tuple[Any, ...], train_score: bool, report: SearchReport,
               gpu: Any, todo: list[list[int]], warm: Any = None) -> list[dict[int, Any]]:
    """Per fold, ``{candidate: its score node}`` for the candidates ``todo`` gives that fold (``kept``: the
    search memory's fitted shared steps, on the host, or None; ``hooked``: callbacks watch each evaluation).

    ``warm`` (an iteration budget as the resource): per (candidate, fold), the fitted last step to
    continue from (or None: a first fit), the resource's step parameter and its value."""
    from sklearn.utils import get_tags

    Xs, ys = tasks.as_node(X, "X"), tasks.as_node(y, "y")
    pairwise = get_tags(estimator).input_tags.pairwise
    folds = kept.fold_keys(splits) if kept is not None else None
    keys: dict[int, Any] = {}
    score_nodes = []
    for f, (train, test) in enumerate(splits):
        if not todo[f]:
            score_nodes.append({})
            continue
        if composite:
            fold: Any = CompositeFold(report, fold_data(X, y, train, test), score_args, train_score)
        else:
            if pairwise:
                Xtr, Xte = node(tasks.take_pairwise, Xs, train, train), node(tasks.take_pairwise, Xs, test, train)
            else:
                Xtr, Xte = node(tasks.take, Xs, train), node(tasks.take, Xs, test)
            ytr = None if ys is None else node(tasks.take, ys, train)
            yte = None if ys is None else node(tasks.take, ys, test)
            fp = {name: _check_method_params(X, params=p, indices=train) for name, p in by_step.items()}
            sp = None
            if weights:
                sp = (_check_method_params(X, params=score_params, indices=test),
                      _check_method_params(X, params=score_params, indices=train))
            fold = StepsFold(report, (Xtr, Xte, ytr, yte, len(test)), fp, score_args, train_score, sp, gpu,
                             None if kept is None else memory.FoldSteps(kept, folds[f]), batch=not hooked)
        run = todo[f]
        for c in run:
            if composite:
                fold.candidate(specs[c])
                continue
            if c not in keys:
                keys[c] = memory.prefix_keys(steps[c])
                if hooked:   # each evaluation fits its own estimator, as the callbacks expect to see it
                    keys[c] = [*keys[c][:-1], (keys[c][-1], ("evaluation", c))]
            fold.candidate(steps[c], warm=None if warm is None else warm.step(c, f), keys=keys[c])
        score_nodes.append(dict(zip(run, fold.scores())))
    return score_nodes

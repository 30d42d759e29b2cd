"""Hyperparameter search as one learning network: every candidate and fold in one graph.

:class:`GridSearchCV` and :class:`RandomizedSearchCV` take scikit-learn's
arguments and give the same fitted attributes (``cv_results_``,
``best_params_``, ``best_score_``, ``best_index_``, ``best_estimator_``,
``scorer_``, ``n_splits_``, ``refit_time_``, ``multimetric_``).  Instead of
fitting every (candidate, fold) pair on its own, the search builds one network:

* the estimator is cut into *steps*: the steps of a scikit-learn
  :class:`~sklearn.pipeline.Pipeline`, else the estimator as one step;
  a gpunets composite or stack is searched through its own network
  (its machines merged across candidates the same way);
* in each fold, step ``i`` of two candidates is **one fit** when steps
  ``0..i`` are equal: same class and same hyperparameters of each step
  (``get_params(deep=False)``, estimator-valued parameters compared
  recursively), hence the same training inputs;
* a shared step also transforms the fold's test rows once for every
  candidate that shares it; the scores are nodes;
* the whole graph runs at once on the chosen executor (threads on a CPU,
  streams on a GPU, Dask), and a fitted step is dropped as soon as the last
  score that needs it has been computed (the scheduler frees values with no
  consumer left);
* few, large tasks (which counts on Dask, where each task costs a scheduler
  round trip): an upstream step fits, transforms the fold's test rows and
  passes them on in one task; a candidate's last step is fitted and scored in
  one task.  On Dask a shared step thus runs once, on one worker, and the
  tasks that need it run where it lives or fetch it from there.

``search_report_`` tells how many step fits ran and how many a
candidate-by-candidate search would have run; its ``ran`` and ``where``,
read from the run's trace, count the fit tasks the executor ran and where
(on Dask, each worker's address).

>>> import numpy as np, gpunets as gn
>>> from sklearn.pipeline import make_pipeline
>>> from sklearn.preprocessing import StandardScaler
>>> from sklearn.linear_model import Ridge
>>> rng = np.random.default_rng(0)
>>> X, y = rng.normal(size=(60, 4)), rng.normal(size=60)
>>> search = gn.GridSearchCV(make_pipeline(StandardScaler(), Ridge()), {"ridge__alpha": [0.1, 1.0, 10.0]}, cv=3)
>>> search.fit(X, y).best_params_
{'ridge__alpha': 10.0}
>>> search.search_report_.fits
{'standardscaler': 3, 'ridge': 9}
"""

from __future__ import annotations

import inspect
import numbers
import time
from typing import Any

import numpy as np
from sklearn.base import _fit_context, clone, is_classifier
from sklearn.model_selection import ParameterGrid, ParameterSampler, check_cv
from sklearn.model_selection._search import BaseSearchCV
from sklearn.utils._param_validation import HasMethods, Interval, StrOptions
from sklearn.utils.metadata_routing import _routing_enabled
from sklearn.utils.validation import _check_method_params, indexable

from gpunets.api.network import evaluate, last_trace
from gpunets.base.config import config
from gpunets.compute.models import resolve_estimator
from gpunets.core.nodes import node
from gpunets.devices.data import device_of
from gpunets.devices.placement import Device, override_placement
from gpunets.devices.placement import device as device_block
from gpunets.executors import ThreadsExecutor, check_executor_spec
from gpunets.tuning import dropin, memory, onepass_search, stored, tasks, warm
from gpunets.tuning.evaluation import Run as _Run
from gpunets.tuning.evaluation import by_candidate as _by_candidate
from gpunets.tuning.networks import SKLEARN_CONFIG, fold_nodes, is_composite, pipeline_steps
from gpunets.tuning.report import SearchReport
from gpunets.tuning.routing import (
    _fit_params_by_step,
    _pipeline_score_routing,
    _refit_context,
    _routed_by_step,
    _step_names,
    jobs_executor,
    quiet_fallback,
)

__all__ = ["GridSearchCV", "RandomizedSearchCV", "SearchReport", "SERIAL_MAX_VALUES", "SERIAL_TASK_SECONDS"]

# On executor="threads", a search whose folds train on at most SERIAL_MAX_VALUES values (rows x columns) runs
# its tasks in the calling thread while they take less than SERIAL_TASK_SECONDS (ThreadsExecutor(serial_below=)).
# scikit-learn's fits and scores of small arrays are Python holding the GIL: on 2 cores, the 150 fits of rung 0
# of the halving benchmark (Ridge on 1,481 x 20 rows, 1.7 ms each with its two scores) took 0.32 s on two
# threads and 0.25 s in one, those of rung 1 (4,442 rows) 0.15 s and 0.12 s.  Larger folds start on the threads
# at once (their first tasks, rows taken and scalers fitted, would wait in one thread before the rule saw them).
SERIAL_TASK_SECONDS = 0.004
SERIAL_MAX_VALUES = 1 << 18


# --- the searches ----------------------------------------------------------------------------------------------

class _NetworkSearch(BaseSearchCV):
    """What the searches share: scikit-learn's ``BaseSearchCV`` with each ``evaluate_candidates`` call
    run as one gpunets network."""

    _gn_record: Any = None   # while a network runs: where each (candidate, fold) result is kept at once
    _gn_skeys: Any = None    # while a network runs on Dask: each (candidate, fold) result's store key, or None
    if not hasattr(BaseSearchCV, "set_callbacks"):   # a scikit-learn without callbacks: refused, saying why
        set_callbacks = dropin.Unavailable("scikit-learn's callback API (set_callbacks, ProgressBar...)", "1.9")

    _parameter_constraints: dict = {
        "estimator": [HasMethods(["fit"])],
        "scoring": BaseSearchCV._parameter_constraints["scoring"],
        "refit": ["boolean", str, callable],
        "cv": ["cv_object"],
        "error_score": [StrOptions({"raise"}), numbers.Real],
        "return_train_score": ["boolean"],
        "executor": "no_validation",
        "device": "no_validation",
        "workers": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "n_jobs": [numbers.Integral, None],
        "verbose": ["verbose"],
        "pre_dispatch": [numbers.Integral, str],
    }

    def _candidates(self) -> list[dict[str, Any]]:  # pragma: no cover - subclasses
        raise NotImplementedError

    def __sklearn_tags__(self) -> Any:
        """scikit-learn's search tags, and the estimator's ``multi_output``: a search of a multi-output
        estimator takes a 2-D target as it does (scikit-learn's ``check_supervised_y_2d``)."""
        from sklearn.utils import get_tags

        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = get_tags(self.estimator).target_tags.multi_output
        return tags

    def _run_search(self, evaluate_candidates: Any, *, callback_ctx: Any = None) -> None:
        # the candidates drawn once per fit (by _check_candidates): a RandomState object given as random_state
        # advances with each draw, and scikit-learn draws once
        candidates = self.__dict__.pop("_gn_candidates", None)
        if candidates is None:
            candidates = self._candidates()
        ctx = dropin.subcontext(callback_ctx, "search", max_subtasks=len(candidates) * self.n_splits_,
                                sequential_subtasks=False).call_on_fit_task_begin(estimator=self)
        evaluate_candidates(candidates, callback_ctx=ctx)
        ctx.call_on_fit_task_end(estimator=self)

    def _check_candidates(self) -> None:
        """Refuse an empty search before anything is built; the candidates are kept for :meth:`_run_search`
        (drawn once: scikit-learn's search samples a ``RandomState`` object once per fit)."""
        candidates = self._candidates()
        self._gn_candidates = candidates
        if not candidates:
            msg = (f"{type(self).__name__} has no candidate to evaluate: the parameter grid is empty. "
                   "Hint: give at least one value per parameter, e.g. {'alpha': [0.1, 1.0]}.")
            raise ValueError(msg)

    def _check_search_input(self, X: Any, y: Any, split_params: dict[str, Any]) -> None:
        """Checks of a subclass (successive halving's), before any fit."""
        self._check_input_parameters(X=X, y=y, split_params=split_params)

    @_fit_context(prefer_skip_nested_validation=False)
    def fit(self, X: Any, y: Any = None, **params: Any) -> _NetworkSearch:
        """Run every candidate on every fold as one network, then refit the best on all rows.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,), optional
        **params : dict
            ``groups`` goes to the splitter; other parameters to the estimator's ``fit``
            (split with the rows, as scikit-learn does).

        Returns
        -------
        self
        """
        return self._fit(X, y, **params)

    def _fit(self, X: Any, y: Any = None, **params: Any) -> _NetworkSearch:
        # --- everything that can be wrong is checked here, before any fit ---
        self.__dict__.pop("_gn_one_pass", None)   # an earlier fit's moments (gpunets.tuning.onepass_search)
        scorers, refit_metric = self._get_scorers()
        X, y = indexable(X, y)
        params = _check_method_params(X, params=params)
        # scikit-learn's routing, its requests and its errors (UnsetMetadataPassedError...); with routing
        # off: ``groups`` to the splitter, the rest to the estimator, ``sample_weight`` also to scorers that
        # take it
        routed = self._get_routed_params_for_fit(params)
        split_params = dict(routed.splitter.split)
        fit_params, score_params = dict(routed.estimator.fit), dict(routed.scorer.score)
        workers = dropin.workers(self)
        self._check_candidates()
        check_executor_spec(self.executor)  # a bad executor fails now, not after the folds are built
        base = clone(self.estimator)
        self._checked_cv_orig = check_cv(self.cv, y, classifier=is_classifier(self.estimator))
        dropin.check_pairwise(self.estimator, X)
        self._check_search_input(X, y, split_params)
        self.n_splits_ = self._checked_cv_orig.get_n_splits(X, y, **split_params)
        metadata = {"sample_weight": params["sample_weight"]} if params.get("sample_weight") is not None else None
        root_ctx = dropin.root_context(self, max_subtasks=1 + (self.refit is not False))
        root_ctx.call_on_fit_task_begin(estimator=self, X=X, y=y, metadata=metadata)
        run = _Run(self, base, X, y, split_params, fit_params, score_params, scorers, workers)
        self._gn_reports: list[SearchReport] = []
        if "callback_ctx" in inspect.signature(self._run_search).parameters:
            self._run_search(run.evaluate_candidates, callback_ctx=root_ctx)
        else:   # a scikit-learn without callbacks
            self._run_search(run.evaluate_candidates)
        if not run.outs:   # scikit-learn's words, when a search evaluated nothing
            msg = ("No fits were performed. Was the CV iterator empty? Were there no candidates? "
                   "(Hint: give at least one candidate and a cv that yields train/test splits.)")
            raise ValueError(msg)
        self.search_report_ = self._search_report(self._gn_reports)
        del self._gn_reports
        results = run.results
        outs = run.outs
        self.multimetric_ = isinstance(outs[0]["test_scores"], dict)
        if callable(self.scoring) and self.multimetric_:
            self._check_refit_for_multimetric(outs[0]["test_scores"])
            refit_metric = self.refit

        if self.refit or not self.multimetric_:
            self.best_index_ = self._select_best_index(self.refit, refit_metric, results)
            if not callable(self.refit):
                self.best_score_ = results[f"mean_test_{refit_metric}"][self.best_index_]
            self.best_params_ = results["params"][self.best_index_]
        if self.refit:
            self.best_estimator_ = clone(base).set_params(**clone(self.best_params_, safe=False))
            refit_ctx = root_ctx.subcontext(task_name="refit-with-best-params")
            report = self.search_report_
            with dropin.propagating(refit_ctx, self.best_estimator_):
                refit_ctx.call_on_fit_task_begin(estimator=self, X=X, y=y, metadata=metadata)
                start = time.time()
                with _refit_context(getattr(report, "last", report)) as Xr:
                    Xf, yf = Xr(X, y)   # upstream steps kept from an earlier refit on the same data, else fit
                    # a one-pass search: the best candidate built from the moments of all rows, where it can be
                    moments = onepass_search.refit(self, self.best_estimator_, X, y, fit_params)
                    kept = None if moments else memory.refit_kept(self, self.best_estimator_, Xf, yf, fit_params)
                    if moments:
                        pass
                    elif kept is not None:
                        report.refit_reused, report.refit_stored, report.refit_again = kept
                    else:   # one task: a forest grows its trees on the search's lanes
                        with warm.threaded_trees(self.best_estimator_, warm.lanes(self.executor, workers)):
                            if y is not None:
                                self.best_estimator_.fit(Xf, yf, **fit_params)
                            else:
                                self.best_estimator_.fit(Xf, **fit_params)
                self.refit_time_ = time.time() - start
            if hasattr(self.best_estimator_, "feature_names_in_"):
                self.feature_names_in_ = self.best_estimator_.feature_names_in_
            refit_ctx.call_on_fit_task_end(estimator=self, X=X, y=y, metadata=metadata)
        self.__dict__.pop("_gn_one_pass", None)
        from sklearn.metrics._scorer import _MultimetricScorer

        self.scorer_ = scorers._scorers if isinstance(scorers, _MultimetricScorer) else scorers
        self.cv_results_ = results
        root_ctx.call_on_fit_task_end(estimator=self, X=X, y=y, metadata=metadata)
        return self

    def _search_report(self, reports: list[SearchReport]) -> Any:
        """``search_report_`` from the reports of the network runs (one per ``evaluate_candidates`` call)."""
        return reports[0] if len(reports) == 1 else SearchReport.merged(reports)

    def forget(self) -> _NetworkSearch:
        """Empty the search's memory of fitted (candidate, fold) results (see :mod:`gpunets.tuning.memory`).

        Returns
        -------
        self
        """
        self.__dict__.pop("_gn_memory", None)
        return self

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_gn_memory", None)   # the search's memory of fitted results stays in this process
        state.pop("_gn_candidates", None)   # left by a fit that stopped before evaluating
        state.pop("_gn_one_pass", None)   # the moments of a fit that stopped before its refit
        return state

    def _evaluate(self, candidates: list[dict[str, Any]], splits: list[tuple[np.ndarray, np.ndarray]],
                  data: Any) -> list[dict[str, Any]]:
        """scikit-learn's ``_fit_and_score`` outputs of every (candidate, fold), candidate-major: those
        the search's memory holds for the same data, the others computed as one network."""
        X, y, fit_params, score_params, scorers, workers, base, shared = data
        mem = shared.get("memory")
        if mem is None or self.__dict__.get("_gn_memory") is not mem:   # the data fingerprinted once per fit
            mem = shared["memory"] = memory.of(self, X, y, fit_params, score_params, scorers)
        specs = mem.specs(base, candidates, cache=not is_composite(base))   # unknown names raise here
        # a warm-started iteration budget: each (candidate, fold) continued from a previous fit is another result,
        # keyed with the budgets it grew through (never served to a cold search, nor a cold one to it)
        warm = self._warm_plan(candidates, splits, mem)
        tags = None if warm is None else warm.tags()
        keys, todo = mem.lookup(specs, splits, tags)
        if self._watched() is not None:   # callbacks watch every evaluation's fit: none from the memory
            todo = [list(range(len(specs))) for _ in splits]
        # results kept in the store of fitted states (docs/store.md): a search run again in a new process
        skeys = stored.result_keys(self, specs, splits, X, y, fit_params, score_params, tags)
        from_store = memory.load_stored(mem, keys, skeys, todo, len(splits))
        if warm is not None and any(todo):   # a warm result neither kept nor continuable (its previous fit is not
            cold_keys, _ = mem.lookup(specs, splits)   # in memory: loaded, or another process's): a cold fit
            cold_skeys = stored.result_keys(self, specs, splits, X, y, fit_params, score_params)
            for f, cands in enumerate(todo):
                for c in list(cands):
                    i = c * len(splits) + f
                    if warm.go_cold(c, f):
                        keys[i] = cold_keys[i]
                        if skeys is not None and cold_skeys is not None:
                            skeys[i] = cold_skeys[i]
                        if keys[i] is not None and keys[i] in mem.results:
                            cands.remove(c)
            from_store += memory.load_stored(mem, keys, skeys, todo, len(splits))
        if self.verbose > 0:   # scikit-learn's line, saying what is left to fit
            print(dropin.fitting_line(len(splits), len(candidates), sum(len(t) for t in todo), from_store))
        outs: list[Any] = [mem.get(k) for k in keys]
        if any(todo):
            def record(c: int, f: int, out: dict[str, Any]) -> None:
                mem.put(keys[c * len(splits) + f], out)
                if skeys is not None and out.get("_raise") is None:
                    stored.keep_result(skeys[c * len(splits) + f], stored.entry(out))

            self._gn_record, self._gn_skeys = record, skeys
            device = self.device
            args = (specs, X, y, splits, scorers, fit_params, score_params, todo, warm, workers)
            try:
                if device is not None and device != "auto":
                    with config(device=device), override_placement(device), quiet_fallback(self, device):
                        new, report = self._run_network(*args)
                else:
                    new, report = self._run_network(*args)
            finally:
                self._gn_record = self._gn_skeys = None
            dask = memory.is_dask(self.executor if self.executor != "auto" else None)
            for (c, f), o in new.items():
                i = c * len(splits) + f
                kept = o.pop("_kept", False)   # written by its task, on a worker that shares the store
                outs[i] = o
                mem.put(keys[i], o)
                if skeys is not None and dask and not kept and o.get("_raise") is None:
                    stored.keep_result(skeys[i], stored.entry(o))   # the workers have no store: the client keeps it
        else:
            report = SearchReport(fits={}, naive={})
        report.remembered = sum(len(splits) - len(t) for t in _by_candidate(todo, len(specs)))
        report.results_stored = from_store
        report.candidates = len(specs)
        self._gn_reports.append(report)
        self._after_run(candidates, splits, outs, mem)
        return outs

    def _watched(self) -> dropin.Evaluations | None:
        """This call's evaluations when scikit-learn's callbacks watch their fits here (not on Dask), else None."""
        evals = self.__dict__.get("_gn_evaluations")
        dask = memory.is_dask(None if self.executor == "auto" else self.executor)
        return evals if evals is not None and evals.live and not dask else None

    def _kept_steps(self, gpu: Any, composite: bool) -> Any:
        """The memory that keeps fitted shared steps for this run: None on a GPU, on Dask, for composites."""
        executor = None if self.executor == "auto" else self.executor
        if gpu is not None or composite or self._gn_record is None or memory.is_dask(executor):
            return None
        return self.__dict__.get("_gn_memory")

    def _warm_plan(self, candidates: list[dict[str, Any]], splits: Any, mem: Any) -> Any:
        return None

    def _after_run(self, candidates: list[dict[str, Any]], splits: Any, outs: list[dict[str, Any]],
                   mem: Any) -> None:
        return None

    # --- the network ---------------------------------------------------------------------------------
    def _run_network(self, specs: list[Any], X: Any, y: Any, splits: list[tuple[np.ndarray, np.ndarray]],
                     scorers: Any, params: dict[str, Any], score_params: dict[str, Any],
                     todo: list[list[int]], warm: Any, workers: int | None,
                     ) -> tuple[dict[tuple[int, int], dict[str, Any]], SearchReport]:
        """Run the (candidate, fold) pairs ``todo`` (per fold, the candidates to run) as one network:
        ``({(candidate, fold): its _fit_and_score output}, report)``."""
        from sklearn.metrics._scorer import _MultimetricScorer

        # a linear pipeline fitted and scored from the folds' moments (gpunets.tuning.onepass_search), else why not
        one_pass = onepass_search.run(self, specs, X, y, splits, scorers, params, score_params, todo, warm)
        if not isinstance(one_pass, onepass_search.OnePass):
            return one_pass
        composite = not params and all(is_composite(s) for s in specs)
        steps: Any = None if composite else [pipeline_steps(s) for s in specs]
        if steps is not None and any(s is None for s in steps):
            steps = [[(type(self.estimator).__name__, s)] for s in specs]
        names = [] if steps is None else _step_names(steps)
        by_step: Any = None
        if len(names) > 1:
            by_step = (_routed_by_step(specs[0], steps[0], params) if _routing_enabled()
                       else _fit_params_by_step(params, names))
        if by_step is None and len(names) > 1:  # a parameter no step takes: the pipeline's fit says so
            steps = [[(type(self.estimator).__name__, s)] for s in specs]
            names = [steps[0][0][0]]
        if len(names) == 1:
            by_step = {names[0]: params}
        weights = bool(score_params) and not composite   # what scikit-learn's routing gives the scorers
        dev = Device.parse("cpu" if self.device in (None, "auto") else self.device)
        if self.device in (None, "auto") and not composite:
            dev = device_of(X)  # CuPy data: the search runs on its GPU
        gpu = dev if dev.is_cuda and not composite else None
        pairs = sum(len(t) for t in todo)
        report = SearchReport(fits={n: 0 for n in names}, naive={n: pairs for n in names})
        report.one_pass = one_pass
        if gpu is not None:
            routes = {resolve_estimator(est, gpu, what=f"search step {name!r}", fallback="silent").path
                      for steps_ in steps for name, est in steps_}
            report.refit_route = ("array_api", gpu) if routes == {"array_api"} else ("cpu", None)
        n_scores = tuple(scorers._scorers) if isinstance(scorers, _MultimetricScorer) else None
        score_scorer: Any = scorers
        if weights and _routing_enabled() and len(names) > 1 and self.scoring is None:
            # the default scorer calls Pipeline.score, whose routing checks the steps' score requests: the
            # scores read the last step, so check them here; a refusal fails every score, as in scikit-learn
            score_scorer, score_params = _pipeline_score_routing(specs[0], names[-1], scorers, score_params)
            weights = bool(score_params)
        score_args = (score_scorer, self.error_score, n_scores)
        train_score = bool(self.return_train_score)
        # the search's own nodes (rows taken, fold parameters, scores) go where its steps run: the search's
        # GPU, else the host (an input-less node on "auto" would take a GPU and drag the folds there)
        import sklearn

        token = SKLEARN_CONFIG.set(sklearn.get_config() if _routing_enabled() else None)
        try:
            with device_block(str(gpu) if gpu is not None else "cpu"):
                score_nodes = fold_nodes(self.estimator, self._kept_steps(gpu, composite), self._watched() is not None,
                                         X, y, splits, specs, steps, composite, by_step, score_params,
                                         weights, score_args, train_score, report, gpu, todo, warm)
        finally:
            SKLEARN_CONFIG.reset(token)
        # scikit-learn's order: candidate-major, fold-minor
        pairs_done = [(c, f) for c in range(len(specs)) for f in range(len(splits)) if c in score_nodes[f]]
        ordered = [score_nodes[f][c] for c, f in pairs_done]
        executor = jobs_executor(self.executor, self.n_jobs, gpu)   # n_jobs=2: candidates side by side
        if self._gn_record is not None and not memory.is_dask(executor):
            # each result kept by the task that computes it: an interrupted fit continues where it stopped
            for pair, n in zip(pairs_done, ordered):
                memory.record_in(n, self._gn_record, pair)
        elif self._gn_skeys is not None:   # on Dask: written by the task, where the workers share the store
            for (c, f), n in zip(pairs_done, ordered):
                stored.keep_in(n, self._gn_skeys[c * len(splits) + f])
        evals = self._watched()
        if evals is not None:
            # each evaluation's callback hooks fire in its task, around its fit (gpunets.tuning.dropin)
            for (c, f), n in zip(pairs_done, ordered):
                if callable(n.operation):
                    n.operation = dropin.Evaluating(n.operation, evals, c * len(splits) + f,
                                                    whole=len(names) == 1 or composite)
        target = node(tasks.collect, *ordered, device=str(gpu) if gpu is not None else "cpu")
        if executor == "threads" and _small_folds(X, splits):   # short tasks of small fits run in this thread
            executor = ThreadsExecutor(workers=workers, serial_below=SERIAL_TASK_SECONDS)
        start = time.perf_counter()
        outs = evaluate(target, output="device", executor=executor, workers=workers)
        report.seconds = time.perf_counter() - start
        # last steps fitted in a batch (tuning.batched); what the step tasks did with the store (also on Dask
        # workers): each stored.Done once, named by the step of the candidate whose result carried it
        report.count_batched([o.pop("_batched", None) for o in outs])
        done: dict[Any, str] = {}
        for (c, _), o in zip(pairs_done, outs):
            for d in o.pop("_stored", ()):
                if d not in done:
                    depth = getattr(d, "depth", 0)
                    own = steps[c] if steps is not None else []
                    done[d] = own[depth][0] if depth < len(own) else (names[-1] if names else "?")
        trace = last_trace()
        report.trace = trace
        report.read_trace(() if trace is None else trace.records)   # the fit tasks that ran, and where
        report.count_done((step, d) for d, step in done.items())
        return dict(zip(pairs_done, outs)), report



def _small_folds(X: Any, splits: list[tuple[np.ndarray, np.ndarray]]) -> bool:
    """Whether the largest training fold holds at most :data:`SERIAL_MAX_VALUES` values of ``X``."""
    shape = getattr(X, "shape", None) or (len(X),)
    columns = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return max((len(train) for train, _ in splits), default=0) * columns <= SERIAL_MAX_VALUES


class GridSearchCV(_NetworkSearch):
    """Exhaustive search over a parameter grid, run as one learning network.

    A drop-in for :class:`sklearn.model_selection.GridSearchCV` (same
    ``cv_results_``, ranks and best candidate); steps that candidates share are
    fitted once per fold (see :mod:`gpunets.tuning`).

    Parameters
    ----------
    estimator : estimator
        A scikit-learn Pipeline (each step shared where candidates agree), a
        gpunets composite or stack, or any estimator.
    param_grid : dict or list of dicts
        As in scikit-learn (``step__param`` names for pipelines).
    scoring, refit, cv, error_score, return_train_score :
        As in scikit-learn.
    executor : {"auto", "serial", "threads", "streams", "dask"} or Executor
        Where the search network runs.
    device : str
        ``"auto"``, ``"cpu"``, ``"cuda"``...: placement of the network.
    workers : int, optional
        Threads or lanes (default: the cores).
    n_jobs : int, optional
        scikit-learn's name for ``workers``: ``-1`` all cores, ``None`` the executor's default.
    verbose : int
        ``> 0`` prints scikit-learn's "Fitting ... folds" line.
    pre_dispatch : int or str
        Accepted for scikit-learn's code; no effect (the network dispatches a task when its inputs are
        ready).

    Attributes
    ----------
    cv_results_, best_params_, best_score_, best_index_, best_estimator_, scorer_, n_splits_, refit_time_,
    multimetric_ :
        As in scikit-learn.
    search_report_ : SearchReport
        Step fits done against those of a candidate-by-candidate search.

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from sklearn.linear_model import Ridge
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(40, 3)), rng.normal(size=40)
    >>> s = gn.GridSearchCV(Ridge(), {"alpha": [0.1, 10.0]}, cv=2).fit(X, y)
    >>> s.best_params_, s.cv_results_["rank_test_score"].tolist()
    ({'alpha': 10.0}, [2, 1])
    """

    _parameter_constraints: dict = {**_NetworkSearch._parameter_constraints, "param_grid": [dict, list]}

    def __init__(self, estimator: Any, param_grid: Any, *, scoring: Any = None, n_jobs: int | None = None,
                 refit: Any = True, cv: Any = None, verbose: int = 0, pre_dispatch: Any = "2*n_jobs",
                 error_score: Any = np.nan, return_train_score: bool = False, executor: Any = "auto",
                 device: Any = "auto", workers: int | None = None) -> None:
        self.estimator = estimator
        self.param_grid = param_grid
        self.scoring = scoring
        self.n_jobs = n_jobs
        self.verbose = verbose
        self.pre_dispatch = pre_dispatch
        self.refit = refit
        self.cv = cv
        self.error_score = error_score
        self.return_train_score = return_train_score
        self.executor = executor
        self.device = device
        self.workers = workers

    def _candidates(self) -> list[dict[str, Any]]:
        return list(ParameterGrid(self.param_grid))


class RandomizedSearchCV(_NetworkSearch):
    """Search over ``n_iter`` candidates sampled from distributions, run as one learning network.

    A drop-in for :class:`sklearn.model_selection.RandomizedSearchCV` (the
    same candidates for the same ``random_state``); parameters as
    :class:`GridSearchCV` plus ``param_distributions``, ``n_iter`` and
    ``random_state``.

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from scipy.stats import loguniform
    >>> from sklearn.linear_model import Ridge
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(40, 3)), rng.normal(size=40)
    >>> s = gn.RandomizedSearchCV(Ridge(), {"alpha": loguniform(1e-2, 1e2)}, n_iter=4, cv=2, random_state=0)
    >>> len(s.fit(X, y).cv_results_["params"])
    4
    """

    _parameter_constraints: dict = {
        **_NetworkSearch._parameter_constraints,
        "param_distributions": [dict, list],
        "n_iter": [Interval(numbers.Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
    }

    def __init__(self, estimator: Any, param_distributions: Any, *, n_iter: int = 10, scoring: Any = None,
                 n_jobs: int | None = None, refit: Any = True, cv: Any = None, verbose: int = 0,
                 pre_dispatch: Any = "2*n_jobs", random_state: Any = None, error_score: Any = np.nan,
                 return_train_score: bool = False, executor: Any = "auto", device: Any = "auto",
                 workers: int | None = None) -> None:
        self.estimator = estimator
        self.param_distributions = param_distributions
        self.n_iter = n_iter
        self.scoring = scoring
        self.n_jobs = n_jobs
        self.verbose = verbose
        self.pre_dispatch = pre_dispatch
        self.refit = refit
        self.cv = cv
        self.random_state = random_state
        self.error_score = error_score
        self.return_train_score = return_train_score
        self.executor = executor
        self.device = device
        self.workers = workers

    def _candidates(self) -> list[dict[str, Any]]:
        return list(ParameterSampler(self.param_distributions, self.n_iter, random_state=self.random_state))

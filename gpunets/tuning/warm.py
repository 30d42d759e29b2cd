"""An iteration budget as successive halving's resource, warm-started across rungs.

With ``resource="n_estimators"`` (or ``max_iter``, any parameter of ``gn.config(warm_params=...)``)
scikit-learn's halving refits every survivor from scratch at each rung.  gpunets continues it: the
survivor's last step, fitted in the previous rung on the same fold, is copied and fitted further with
``warm_start=True`` and the grown budget (the rule of :mod:`gpunets.core.machines`' warm updates).  For forests
with an integer ``random_state`` the trees added are those a cold fit would grow, so the scores equal a
cold search's exactly; for estimators whose warm start is not exact (gradient boosting draws its
subsamples from a new random stream; solvers restart from the previous coefficients), ``warm_start=False``
on the search gives scikit-learn's cold rungs.

>>> from sklearn.ensemble import RandomForestRegressor
>>> warm_target(RandomForestRegressor(), "n_estimators")
('RandomForestRegressor', 'n_estimators')
"""

from __future__ import annotations

import contextlib
import copy
import time
import traceback
from collections.abc import Hashable, Iterator
from typing import Any

from gpunets.base.config import get_config
from gpunets.base.saved import saved_operation
from gpunets.compute.estimators import own_inputs
from gpunets.executors.base import default_workers
from gpunets.tuning.networks import is_composite, pipeline_steps
from gpunets.tuning.tasks import Failed, Stage, aligned, materialize, moved, on_device, score_fit

__all__ = ["WarmPlan", "check_warm", "inner_jobs", "lanes", "threaded_trees", "warm_fit_and_score", "warm_target"]


def warm_target(estimator: Any, resource: str) -> tuple[str, str] | None:
    """``(the step's name, its parameter)`` that ``resource`` names on the estimator's last step, when a
    warm update can continue it; None when it cannot (see :func:`check_warm` for why)."""
    return None if _why_not(estimator, resource) else _target(estimator, resource)


def _target(estimator: Any, resource: str) -> tuple[str, str]:
    steps = pipeline_steps(estimator)
    if steps is None:
        return type(estimator).__name__, resource
    name, _, param = resource.partition("__")
    return name, param


def _why_not(estimator: Any, resource: str) -> str | None:
    """Why ``resource`` cannot be warm-started on ``estimator``; None when it can."""
    known = tuple(get_config()["warm_params"])
    if is_composite(estimator):
        return f"{type(estimator).__name__} is a gpunets composite: its rungs are refitted (warm updates continue one estimator)"
    steps = pipeline_steps(estimator)
    if steps is None:
        last, param = estimator, resource
    else:
        name, sep, param = resource.partition("__")
        if not sep or name != steps[-1][0]:
            return (f"resource={resource!r} is not a parameter of the pipeline's last step {steps[-1][0]!r} "
                    f"(e.g. {steps[-1][0]}__n_estimators)")
        last = steps[-1][1]
    if "__" in param or param not in known:
        return f"the warm-update rules know {list(known)} (gn.config(warm_params=...)), not {param!r}"
    if "warm_start" not in last.get_params(deep=False):
        return f"{type(last).__name__} has no warm_start parameter to continue a fit with"
    return None


def check_warm(search: Any) -> bool:
    """Whether the search warm-starts its rungs; a ValueError when ``warm_start=True`` cannot be honoured."""
    mode = search.warm_start
    if mode not in ("auto", True, False) or (mode is not True and mode is not False and mode != "auto"):
        msg = (f"warm_start={mode!r} is not a warm-start mode: expected 'auto' (warm where the warm-update rules "
               "allow it), True (warm, or an error) or False (refit each rung, as scikit-learn). Hint: pass "
               "warm_start=False for scikit-learn's cold rungs.")
        raise ValueError(msg)
    if search.resource == "n_samples" or mode is False:
        return False
    why = _why_not(search.estimator, search.resource)
    if why is None:
        return True
    if mode is True:
        known = list(get_config()["warm_params"])
        msg = (f"{type(search).__name__}(resource={search.resource!r}, warm_start=True): cannot warm-start it: "
               f"{why}. Warm-startable resources: {known} on an estimator with warm_start (a pipeline's last "
               "step: 'step__n_estimators'). Hint: pass warm_start=False to refit each rung as scikit-learn does, "
               "or gn.config(warm_params=(..., 'name')) if a fit with a grown value continues the previous one.")
        raise ValueError(msg)
    return False


class WarmPlan:
    """For one rung: per (candidate, fold), the fitted last step of the previous rung to continue from.

    ``keys[c]`` is candidate ``c``'s key without its resource, ``folds[f]`` fold ``f``'s key, ``budgets[c]`` its
    resource value; the memory's ``fitted`` maps ``(candidate key, fold key)`` to ``(resource value, fitted step,
    the budgets its fit grew through)``; ``jobs``: the threads a forest's fit builds its trees on in this rung
    (:func:`inner_jobs`)."""

    def __init__(self, param: str, keys: list[Hashable | None], folds: list[Hashable], fitted: dict[Any, Any],
                 jobs: int = 1, budgets: list[Any] | None = None, grown: dict[Any, Any] | None = None) -> None:
        self.param, self.keys, self.folds, self.fitted, self.jobs = param, keys, folds, fitted, jobs
        self.budgets = budgets if budgets is not None else [None] * len(keys)
        # (candidate key, fold key) -> (budget, budgets grown through) of its last result, computed or kept
        self.grown = grown if grown is not None else {}
        self.cold: set[tuple[int, int]] = set()

    def _before(self, c: int, f: int) -> tuple[Any, ...] | None:
        """The budgets the previous result of candidate ``c`` on fold ``f`` grew through, when this one grows it."""
        key = self.keys[c]
        hit = None if key is None else self.grown.get((key, self.folds[f]))
        if hit is None:
            return None
        try:
            grows = bool(hit[0] <= self.budgets[c])
        except TypeError:
            grows = False
        return tuple(hit[1]) if grows else None

    def _previous(self, c: int, f: int) -> Any:
        """The fitted step of that previous result, where the memory keeps it (fitted here, not loaded)."""
        key, before = self.keys[c], self._before(c, f)
        hit = None if key is None or before is None else self.fitted.get((key, self.folds[f]))
        return hit if hit is not None and tuple(hit[2]) == before else None

    def step(self, c: int, f: int) -> tuple[Any, str, int]:
        """``(the fitted step to continue, or None, the step's parameter, the threads of its fit)``."""
        hit = None if (c, f) in self.cold else self._previous(c, f)
        return (None if hit is None else hit[1]), self.param, self.jobs

    def go_cold(self, c: int, f: int) -> bool:
        """Candidate ``c`` on fold ``f``, whose warm result is not kept: fit it cold when its previous fit is not
        at hand (True: its key is a cold fit's now)."""
        if self.lineage(c, f) is None or self._previous(c, f) is not None:
            return False
        self.cold.add((c, f))
        return True

    def lineage(self, c: int, f: int) -> tuple[Any, ...] | None:
        """The budgets candidate ``c``'s fit on fold ``f`` grows through (the previous result's, then its own);
        None when it is a plain (cold) fit: nothing to continue.

        >>> grown = {("k", "f"): (2, (2,))}
        >>> plan = WarmPlan("n_estimators", ["k"], ["f"], {}, budgets=[6], grown=grown)
        >>> plan.lineage(0, 0), WarmPlan("n_estimators", ["k"], ["f"], {}, budgets=[6]).lineage(0, 0)
        ((2, 6), None)
        """
        before = None if (c, f) in self.cold else self._before(c, f)
        return None if before is None else (*before, self.budgets[c])

    def tags(self) -> list[Hashable | None]:
        """Per (candidate, fold), candidate-major, what its result's key adds to a plain fit's: ``("warm", the
        budgets it grows through)`` for a warm-started fit, None for a cold one.  A warm result differs from a
        cold one where the warm start is not exact (gradient boosting, solvers restarting from the previous
        coefficients): keyed so, a cold search (``warm_start=False``, a ``GridSearchCV`` of a rung's candidates)
        never gets it, nor a warm search a cold one."""
        out: list[Hashable | None] = []
        for c in range(len(self.keys)):
            for f in range(len(self.folds)):
                lin = self.lineage(c, f)
                out.append(None if lin is None else ("warm", self.param, lin))
        return out


# A rung of fewer tasks than this many per lane leaves lanes idle at its end (its last tasks are few and long):
# its forests build their trees on every lane's thread, so a lane whose task is done helps those still running.
FEW_TASKS_PER_LANE = 4


def lanes(executor: Any, workers: int | None) -> int:
    """The lanes (threads) a search's network runs on, for its tasks' own threads: 1 on Dask or serial."""
    name = executor if isinstance(executor, str) or executor is None else getattr(executor, "name", "")
    if name in ("serial", "dask"):
        return 1
    if workers is None:
        workers = getattr(executor, "workers", None) or get_config()["workers"]
    return max(1, int(workers or default_workers()))


def inner_jobs(tasks: int, n_lanes: int) -> int:
    """The threads each forest fit of a rung of ``tasks`` tasks on ``n_lanes`` lanes builds its trees on.

    Trees release the GIL while they grow, so a fit on ``n_lanes`` threads next to others shares the cores
    with them (the total work is the same) and fills the cores left idle at the rung's end; a rung of many
    tasks keeps its lanes busy on its own (and saves the thread pool each fit would start).

    >>> inner_jobs(5, 2), inner_jobs(135, 2), inner_jobs(5, 1)
    (2, 1, 1)
    """
    return n_lanes if 1 < n_lanes and tasks < FEW_TASKS_PER_LANE * n_lanes else 1


def _forests(est: Any) -> list[Any]:
    """The scikit-learn forests among ``est`` and a plain pipeline's steps whose ``n_jobs`` is unset (or 1)."""
    from sklearn.ensemble._forest import BaseForest

    steps = pipeline_steps(est)
    found = [s for _, s in steps] if steps is not None else [est]
    return [s for s in found if isinstance(s, BaseForest) and s.get_params(deep=False).get("n_jobs") in (None, 1)]


@contextlib.contextmanager
def threaded_trees(est: Any, jobs: int) -> Iterator[None]:
    """Within the block, the forests of ``est`` (:func:`_forests`) build their trees on ``jobs`` threads
    (joblib's threading backend, as ``n_jobs`` does); their ``n_jobs`` is restored after.  The trees are
    the same as on one thread (each from its own seed, in order): only their fit is parallel, not
    ``predict``, whose sum over trees would then come in another order."""
    forests = _forests(est) if jobs > 1 else []
    before = [f.n_jobs for f in forests]
    for f in forests:
        f.n_jobs = jobs
    try:
        yield
    finally:
        for f, n in zip(forests, before):
            f.n_jobs = n


def _warm_estimator(est: Any, previous: Any, param: str, route: Any) -> tuple[Any, bool]:
    """The estimator to fit: a copy of ``previous`` with the grown budget, else a fresh one set to warm-start
    later; and whether the fit is needed (not when the budget did not grow: the previous fit is the answer)."""
    from sklearn.base import clone

    spec = est if route is None else route.estimator
    if route is not None and getattr(route, "path", None) == "cuml":   # a cuML twin: no warm start
        return clone(spec), True
    if previous is None or isinstance(previous, Failed):
        return clone(spec).set_params(warm_start=True), True
    new = spec.get_params(deep=False)[param]
    if getattr(previous, param) == new:
        return previous, False
    out = _continuable_copy(previous)   # the previous rung's fit stays as it was (a resumed rung may read it)
    out.set_params(**{param: new})
    return out, True


def _continuable_copy(fitted: Any) -> Any:
    """A copy of a fitted step that a warm fit can grow without changing ``fitted``.

    A forest's warm fit only appends trees to ``estimators_`` and assigns its other attributes anew: a
    shallow copy with its own list of (shared, never refitted) trees will do, unless its ``random_state``
    is a generator that the fit would draw from.  Anything else is copied whole."""
    from sklearn.ensemble._forest import BaseForest

    if isinstance(fitted, BaseForest) and isinstance(fitted.random_state, (int, type(None))) \
            and isinstance(getattr(fitted, "estimators_", None), list):
        out = copy.copy(fitted)
        out.estimators_ = list(fitted.estimators_)
        return out
    return copy.deepcopy(fitted)


@saved_operation(checked={2: "parameter"})
def warm_fit_and_score(est: Any, previous: Any, param: str, route: Any, fit_params: dict[str, Any], X: Any, y: Any,
                       users: tuple[int, ...], head: tuple[Any, ...], X_test: Any, y_test: Any, X_train: Any,
                       y_train: Any, jobs: int = 1) -> dict[str, Any]:
    """Fit a candidate's last step, continuing ``previous`` (its fit on this fold in the previous rung) when
    there is one, and score it: scikit-learn's ``_fit_and_score`` output, the fitted step under ``_fitted``.
    A forest grows its trees on ``jobs`` threads (:func:`threaded_trees`)."""
    computed: tuple[Any, ...] = ()
    if isinstance(X, Stage):
        X_stage: Any = X
        X, computed = materialize(X.train)   # a loaded step's output, computed now (gpunets.tuning.tasks.Deferred)
    else:
        X_stage = None
    start = time.perf_counter()
    if isinstance(X, Failed):
        step: tuple[Any, Any, float] = (X.as_fit(), None, 0.0)
    else:
        X, y = aligned(X, y)
        fit_params = dict(zip(fit_params, aligned(*fit_params.values())))
        try:
            fitted, needed = _warm_estimator(est, previous, param, route)
            if needed:
                with on_device(route), threaded_trees(fitted, jobs if route is None else 1):
                    Xm, ym = own_inputs(fitted, moved(route, X, y))
                    fitted.fit(Xm, **fit_params) if ym is None else fitted.fit(Xm, ym, **fit_params)
            step = (fitted, None, time.perf_counter() - start)
        except Exception as e:  # noqa: BLE001 - reported by candidate through error_score
            failed = Failed(e, traceback.format_exc(), time.perf_counter() - start)
            step = (failed, None, failed.seconds)
    if X_stage is not None:
        X_test = X_stage
    out = score_fit(route, users, head, step, X_test, y_test, X_train, y_train)
    if computed:
        out["_stored"] = (*out.get("_stored", ()), *computed)
    if not isinstance(step[0], Failed):
        out["_fitted"] = step[0]
    return out

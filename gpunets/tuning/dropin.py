"""scikit-learn's own search parameters on gpunets' searches: ``n_jobs``, ``verbose``, ``pre_dispatch``, callbacks.

* ``n_jobs`` is mapped to ``workers`` (the executor's threads or lanes): ``None`` leaves the executor's
  default, ``-1`` all cores, ``-2`` all but one (joblib's rule), ``k > 0`` ``k`` workers;
* ``verbose > 0`` prints scikit-learn's line per ``evaluate_candidates`` call ("Fitting 5 folds for each of
  ..."), saying how many of those fits run and how many results the store or the search's memory gives
  (:func:`fitting_line`), and successive halving's rung summaries; ``verbose > 1`` its line per (candidate, fold) evaluation
  (``[CV 1/5] END ... total time=``, with the scores from ``verbose > 2`` and the ``START`` lines from
  ``verbose > 9``), in scikit-learn's order, printed once the network has run (:func:`print_fits`);
* ``pre_dispatch`` is accepted and has no effect: the network's scheduler dispatches a task as soon as
  its inputs are ready, never more than its workers at once;
* scikit-learn's callbacks (``set_callbacks``, where the installed scikit-learn has them) get the same
  hooks, in the same counts and on the same task tree, as on scikit-learn's searches.  Each (candidate, fold)
  evaluation's hooks fire in the task that fits its estimator (:class:`Evaluating`, on the in-process
  executors): ``on_fit_task_begin`` just before the fit, with the fold's training rows, ``y`` and
  ``sample_weight``, the auto-propagated callbacks (``ProgressBar``...) propagated into the estimator fitted
  (:func:`fitting`), and ``on_fit_task_end`` once it is scored.  In a pipeline search the estimator fitted
  per evaluation is the last step (the upstream steps are fitted once for many candidates), so the
  propagated callbacks reach that step only, where it supports callbacks.  An evaluation whose result was
  remembered or loaded from the store, or that ran on Dask workers, gets both hooks once the network has
  run.  Where the installed scikit-learn has no
  callbacks, ``search.set_callbacks`` raises :class:`MissingAPI` (an ``AttributeError``, so that
  ``hasattr(search, "set_callbacks")`` stays False) saying which scikit-learn has them.

>>> import os
>>> class S:
...     n_jobs, workers = -1, None
>>> workers(S()) == (os.cpu_count() or 1)
True
"""

from __future__ import annotations

import contextlib
import contextvars
import numbers
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["Evaluating", "MissingAPI", "Unavailable", "check_pairwise", "evaluations", "fire_evaluations", "fitting",
           "print_fits", "propagating", "root_context", "subcontext", "workers"]


class MissingAPI(AttributeError):
    """A scikit-learn API the installed scikit-learn lacks (see :class:`Unavailable`)."""


class Unavailable:
    """A class attribute standing for a scikit-learn method the installed scikit-learn lacks: reading it
    raises :class:`MissingAPI` with the reason and a hint (``hasattr`` is False, as on scikit-learn).

    >>> class Search:
    ...     set_callbacks = Unavailable("scikit-learn's callback API", "1.9")
    >>> hasattr(Search(), "set_callbacks")
    False
    >>> Search().set_callbacks()
    Traceback (most recent call last):
    ...
    gpunets.tuning.dropin.MissingAPI: Search.set_callbacks is scikit-learn's callback API, which the installed scikit-learn ... lacks (it comes with scikit-learn 1.9 or later). Hint: upgrade scikit-learn, or drop the set_callbacks call.
    """

    def __init__(self, what: str, since: str) -> None:
        self.what, self.since, self.name = what, since, "method"

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        import sklearn

        cls = owner.__name__ if owner is not None else type(obj).__name__
        msg = (f"{cls}.{self.name} is {self.what}, which the installed scikit-learn {sklearn.__version__} lacks "
               f"(it comes with scikit-learn {self.since} or later). Hint: upgrade scikit-learn, or drop the "
               f"{self.name} call.")
        raise MissingAPI(msg)


def workers(search: Any) -> int | None:
    """The ``workers`` a search runs with, from its ``workers`` and scikit-learn's ``n_jobs``.

    >>> class S:
    ...     n_jobs, workers = 2, None
    >>> workers(S())
    2
    >>> S.n_jobs, S.workers = None, 3
    >>> workers(S())
    3
    >>> S.n_jobs = 0
    >>> workers(S())
    Traceback (most recent call last):
    ...
    ValueError: n_jobs=0 has no meaning: expected a positive number of workers, -1 (all cores) or None (the executor's default). Hint: pass n_jobs=-1 or n_jobs=2.
    """
    n_jobs = getattr(search, "n_jobs", None)
    own = getattr(search, "workers", None)
    if n_jobs is None:
        return own
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, numbers.Integral) or n_jobs == 0:
        msg = (f"n_jobs={n_jobs!r} has no meaning: expected a positive number of workers, -1 (all cores) or None "
               "(the executor's default). Hint: pass n_jobs=-1 or n_jobs=2.")
        raise ValueError(msg)
    cores = os.cpu_count() or 1
    jobs = int(n_jobs)
    n = jobs if jobs > 0 else max(1, cores + 1 + jobs)
    if own is not None and own != n:
        msg = (f"n_jobs={n_jobs!r} (scikit-learn's name for workers: {n}) and workers={own!r} disagree. "
               "Hint: give only one of them.")
        raise ValueError(msg)
    return n


class _NoContext:
    """A callback context that calls nothing (scikit-learn without callbacks, or a custom ``_run_search``)."""

    def subcontext(self, *args: Any, **kwargs: Any) -> _NoContext:
        return self

    def call_on_fit_task_begin(self, **kwargs: Any) -> _NoContext:
        return self

    def call_on_fit_task_end(self, **kwargs: Any) -> bool:
        return False


def root_context(search: Any, **kwargs: Any) -> Any:
    """The search's root callback context (scikit-learn's ``_init_callback_context``); one that calls
    nothing where the installed scikit-learn has no callbacks."""
    init = getattr(search, "_init_callback_context", None)
    return _NoContext() if init is None else init(**kwargs)


def propagating(ctx: Any, estimator: Any) -> Any:
    """``ctx.propagate_callback_context(estimator)``; nothing to do without callbacks."""
    import contextlib

    if isinstance(ctx, _NoContext):
        return contextlib.nullcontext()
    return ctx.propagate_callback_context(estimator)


def subcontext(ctx: Any, task_name: str, **kwargs: Any) -> Any:
    """``ctx.subcontext(task_name=...)``, or a context that calls nothing when there is no ``ctx``."""
    if ctx is None:
        return _NoContext()
    return ctx.subcontext(task_name=task_name, **kwargs)


class Evaluations:
    """The (candidate, fold) evaluations of one ``evaluate_candidates`` call: their callback subcontexts, made
    ahead in scikit-learn's order (candidate-major), and which of them have fired their hooks."""

    def __init__(self, search: Any, subs: list[Any], live: bool) -> None:
        self.search, self.subs, self.live = search, subs, live
        self.fired = [False] * len(subs)


def evaluations(search: Any, ctx: Any, n: int) -> Evaluations | None:
    """The subcontexts of ``n`` evaluations under ``ctx`` (scikit-learn makes them before the evaluations run,
    even with no callback), or None where there is no callback context."""
    if ctx is None or isinstance(ctx, _NoContext):
        return None
    subs = [ctx.subcontext(task_name="candidate-split-evaluation", task_id=i) for i in range(n)]
    return Evaluations(search, subs, bool(getattr(search, "_skl_callbacks", None)))


def fire_evaluations(evals: Evaluations | None) -> None:
    """The hooks scikit-learn's ``_fit_and_score`` fires, for each evaluation whose task did not fire them
    (remembered, loaded from the store, or run on Dask workers): begun and ended once the network has run."""
    if evals is None or not evals.live:
        return
    for sub, fired in zip(evals.subs, evals.fired):
        if not fired:
            sub.call_on_fit_task_begin(estimator=evals.search)
            sub.call_on_fit_task_end(estimator=evals.search)


class _Current:
    """The evaluation whose task runs in this context, and the hooks' arguments once it began."""

    def __init__(self, sub: Any, search: Any, whole: bool) -> None:
        self.sub, self.search, self.whole = sub, search, whole
        self.begun: dict[str, Any] | None = None


_CURRENT: contextvars.ContextVar[_Current | None] = contextvars.ContextVar("gpunets_evaluation", default=None)


class Evaluating:
    """A (candidate, fold) score task's function that fires that evaluation's callback hooks where it runs
    (scikit-learn's ``_fit_and_score``): ``on_fit_task_begin`` when the estimator's fit starts (:func:`fitting`),
    ``on_fit_task_end`` once the task has scored it; a task that fits nothing (its step loaded, an upstream step
    failed) fires both.  ``whole``: the estimator fitted is the candidate's whole estimator (not the last step of
    a pipeline), so the auto-propagated callbacks go to it as scikit-learn sends them."""

    def __init__(self, fn: Any, evals: Evaluations, index: int, whole: bool) -> None:
        self.fn, self.evals, self.index, self.whole = fn, evals, index, whole
        self.__name__ = getattr(fn, "__name__", "task")
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        cur = _Current(self.evals.subs[self.index], self.evals.search, self.whole)
        token = _CURRENT.set(cur)
        try:
            return self.fn(*args, **kwargs)
        finally:
            _CURRENT.reset(token)
            if cur.begun is None:
                cur.sub.call_on_fit_task_begin(estimator=cur.search)
                cur.begun = {}
            cur.sub.call_on_fit_task_end(estimator=cur.search, **cur.begun)
            self.evals.fired[self.index] = True


@contextlib.contextmanager
def fitting(est: Any, X: Any, y: Any, fit_params: dict[str, Any]) -> Iterator[None]:
    """Around the fit of a candidate's estimator in an :class:`Evaluating` task: the auto-propagated callbacks
    propagated into ``est`` and ``on_fit_task_begin`` fired, as scikit-learn's ``_fit_and_score`` does; nothing
    elsewhere."""
    cur = _CURRENT.get()
    if cur is None or cur.begun is not None:
        yield
        return
    weight = fit_params.get("sample_weight")
    cur.begun = {"X": X, "y": y, "metadata": {"sample_weight": weight} if weight is not None else None}
    propagate = cur.whole or hasattr(est, "set_callbacks")
    with cur.sub.propagate_callback_context(est) if propagate else contextlib.nullcontext():
        cur.sub.call_on_fit_task_begin(estimator=cur.search, **cur.begun)
        yield


def fitting_line(n_splits: int, n_candidates: int, to_fit: int, from_store: int) -> str:
    """scikit-learn's ``verbose > 0`` line for one ``evaluate_candidates`` call, as it is where every
    (candidate, fold) is fitted; else it says how many are fitted and where the others come from (the store of
    fitted states, the search's memory of an earlier fit).

    >>> fitting_line(5, 10, 50, 0)
    'Fitting 5 folds for each of 10 candidates, totalling 50 fits'
    >>> fitting_line(5, 10, 0, 50)
    '5 folds for each of 10 candidates, totalling 50 fits: none to fit, 50 results loaded from the store'
    >>> fitting_line(5, 15, 25, 50)
    'Fitting 5 folds for each of 15 candidates, totalling 75 fits: 25 to fit, 50 results loaded from the store'
    """
    total = n_splits * n_candidates
    line = f"{n_splits} folds for each of {n_candidates} candidates, totalling {total} fits"
    if to_fit == total:
        return "Fitting " + line
    whence = []
    if from_store:
        whence.append(f"{from_store} results loaded from the store")
    if total - to_fit - from_store:
        whence.append(f"{total - to_fit - from_store} remembered from an earlier fit of this search")
    if not to_fit:
        return f"{line}: none to fit, " + ", ".join(whence)
    return f"Fitting {line}: {to_fit} to fit, " + ", ".join(whence)


def print_fits(verbose: int, candidates: list[dict[str, Any]], n_splits: int, outs: list[dict[str, Any]],
               train_score: bool) -> None:
    """scikit-learn's per-evaluation lines (its ``_fit_and_score`` with ``verbose > 1``), candidate-major, for
    ``outs``: ``START`` lines (``verbose > 9``), then ``END`` lines with the times, and the scores from
    ``verbose > 2``.

    >>> print_fits(3, [{"alpha": 0.1}], 1, [{"fit_time": 0.01, "score_time": 0.0, "test_scores": 0.5}], False)
    [CV 1/1] END ................................alpha=0.1;, score=0.500 total time=   0.0s
    """
    if verbose <= 1:
        return
    from joblib import logger

    lines: list[str] = []
    for i, out in enumerate(outs):
        c, f = divmod(i, n_splits)
        progress = ""
        if verbose > 2:
            progress = f" {f + 1}/{n_splits}"
            if verbose > 9:
                progress += f"; {c + 1}/{len(candidates)}"
        params = candidates[c]
        params_msg = ", ".join(f"{k}={params[k]}" for k in sorted(params))
        if verbose > 9:
            start = f"[CV{progress}] START {params_msg}"
            lines.append(f"{start}{(80 - len(start)) * '.'}")
        end = f"[CV{progress}] END "
        result = params_msg + (";" if params_msg else "")
        test: Any = out.get("test_scores")
        train: Any = out.get("train_scores")
        if verbose > 2:
            if isinstance(test, dict):
                for name in sorted(test):
                    result += f" {name}: ("
                    if train_score:
                        result += f"train={train[name]:.3f}, "
                    result += f"test={test[name]:.3f})"
            else:
                result += ", score="
                result += f"(train={train:.3f}, test={test:.3f})" if train_score else f"{test:.3f}"
        result += f" total time={logger.short_format_time(out.get('fit_time', 0.0) + out.get('score_time', 0.0))}"
        lines.append(end + "." * (80 - len(end) - len(result)) + result)
    print("\n".join(lines))


def check_pairwise(estimator: Any, X: Any) -> None:
    """A precomputed kernel must be an array or a sparse matrix: scikit-learn's ``_safe_split`` refuses a list
    the same way (a ``ValueError``), here before any fit.

    >>> from sklearn.svm import SVC
    >>> check_pairwise(SVC(kernel="precomputed"), [[1.0]])
    Traceback (most recent call last):
    ...
    ValueError: Precomputed kernels or affinity matrices have to be passed as arrays or sparse matrices: SVC is pairwise and X is a list. Hint: pass np.asarray(X).
    """
    from sklearn.utils import get_tags

    if get_tags(estimator).input_tags.pairwise and not (hasattr(X, "shape") or hasattr(X, "tocsr")):
        msg = (f"Precomputed kernels or affinity matrices have to be passed as arrays or sparse matrices: "
               f"{type(estimator).__name__} is pairwise and X is a {type(X).__name__}. Hint: pass np.asarray(X).")
        raise ValueError(msg)

"""scikit-learn's own search parameters on gpunets' searches: ``n_jobs``, ``verbose``, ``pre_dispatch``, callbacks.

* ``n_jobs`` is mapped to ``workers`` (the executor's threads or lanes): ``None`` leaves the executor's
  default, ``-1`` all cores, ``-2`` all but one (joblib's rule), ``k > 0`` ``k`` workers;
* ``verbose > 0`` prints scikit-learn's line per ``evaluate_candidates`` call ("Fitting 5 folds for each of
  ...") and successive halving's rung summaries; per-fit lines (``verbose > 1`` in scikit-learn) are not
  printed, the fits being tasks of one network;
* ``pre_dispatch`` is accepted and has no effect: the network's scheduler dispatches a task as soon as
  its inputs are ready, never more than its workers at once;
* scikit-learn's callbacks (``set_callbacks``, where the installed scikit-learn has them) get the same
  hooks, in the same counts and on the same task tree, as on scikit-learn's searches; the per
  (candidate, fold) hooks fire once its network has run.  Where the installed scikit-learn has no
  callbacks, ``search.set_callbacks`` raises :class:`MissingAPI` (an ``AttributeError``, so that
  ``hasattr(search, "set_callbacks")`` stays False) saying which scikit-learn has them.

>>> import os
>>> class S:
...     n_jobs, workers = -1, None
>>> workers(S()) == (os.cpu_count() or 1)
True
"""

from __future__ import annotations

import numbers
import os
from typing import Any

__all__ = ["MissingAPI", "Unavailable", "fire_evaluations", "propagating", "root_context", "subcontext", "workers"]


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


def fire_evaluations(search: Any, ctx: Any, n: int) -> None:
    """The hooks scikit-learn's ``_fit_and_score`` fires for each of ``n`` (candidate, fold) evaluations:
    one ``candidate-split-evaluation`` subcontext each, begun and ended (after the network has run)."""
    if ctx is None or isinstance(ctx, _NoContext) or not getattr(search, "_skl_callbacks", None):
        if ctx is not None and not isinstance(ctx, _NoContext):
            for task_id in range(n):   # the task tree as scikit-learn builds it, even with no callback
                ctx.subcontext(task_name="candidate-split-evaluation", task_id=task_id)
        return
    for task_id in range(n):
        sub = ctx.subcontext(task_name="candidate-split-evaluation", task_id=task_id)
        sub.call_on_fit_task_begin(estimator=search)
        sub.call_on_fit_task_end(estimator=search)

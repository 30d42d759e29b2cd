"""A search's memory of its (candidate, fold) results: resume after an interrupt, grow a grid.

Within one process a search object keeps every ``_fit_and_score`` output it computed, keyed by the
candidate (its estimator's class and hyperparameters, :func:`~gpunets.tuning.tasks.step_key`) and the
fold (its train and test rows), for one *context*: the fingerprints of ``X``, ``y`` and the fit and
score parameters, the scoring, ``return_train_score`` and ``error_score``.  A ``fit`` on the same
context runs only the pairs it does not hold:

* after an interrupt (Ctrl-C in a notebook), ``fit`` again continues: each result is kept as soon as it
  is computed (on the in-process executors; on Dask, as each network finishes);
* refitted with a widened grid, the search fits only the new candidates.

New data (or data changed in place), another scoring or another ``error_score`` start a new memory.  A
``clone`` starts empty, and the memory is not pickled.  Results that stop the search (a scorer that
returns a non-number) are never kept.  ``search.forget()`` empties it.

>>> m = Memory("ctx")
>>> m.put(("cand", "fold"), {"test_scores": 1.0, "_warnings": ["w"]})
>>> m.get(("cand", "fold"))["test_scores"], len(m)
(1.0, 1)
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

import numpy as np

from gpunets.devices.fingerprint import fingerprint
from gpunets.tuning import tasks

__all__ = ["Memory", "Recorded", "is_dask", "of", "record_in"]


class Memory:
    """The results of one search object on one context (see the module's notes)."""

    def __init__(self, context: Hashable) -> None:
        self.context = context
        self.results: dict[Hashable, dict[str, Any]] = {}
        # an iteration budget warm-started: (candidate without its resource, fold) -> (resource, fitted step)
        self.fitted: dict[Hashable, tuple[Any, Any]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.results)

    def get(self, key: Hashable | None) -> dict[str, Any] | None:
        """A copy of the result kept for ``key``, or None."""
        if key is None:
            return None
        hit = self.results.get(key)
        return None if hit is None else dict(hit)

    def put(self, key: Hashable | None, out: dict[str, Any]) -> None:
        """Keep a copy of ``out`` (not a result that stops the search; its fitted step apart)."""
        if key is None or out.get("_raise") is not None:
            return
        out = dict(out)
        out.pop("_fitted", None)
        with self._lock:
            self.results[key] = out

    def lookup(self, specs: list[Any], splits: list[tuple[np.ndarray, np.ndarray]],
               extra: Any = None) -> tuple[list[Hashable | None], list[list[int]]]:
        """The key of every (candidate, fold), candidate-major, and per fold the candidates to run.

        ``extra`` (a list, one per candidate) is added to each candidate's key."""
        folds = [(fingerprint(np.asarray(tr)), fingerprint(np.asarray(te))) for tr, te in splits]
        cands = [candidate_key(s) for s in specs]
        if extra is not None:
            cands = [None if c is None else (c, e) for c, e in zip(cands, extra)]
        keys: list[Hashable | None] = [None if c is None else (c, f) for c in cands for f in folds]
        todo = [[c for c in range(len(specs)) if keys[c * len(splits) + f] not in self.results]
                for f in range(len(splits))]
        return keys, todo

    def fold_keys(self, splits: list[tuple[np.ndarray, np.ndarray]]) -> list[Hashable]:
        return [(fingerprint(np.asarray(tr)), fingerprint(np.asarray(te))) for tr, te in splits]


def candidate_key(spec: Any) -> Hashable | None:
    """A candidate's key: its estimator's class and hyperparameters; None when they cannot be compared."""
    try:
        key = tasks.step_key(spec)
        hash(key)
    except Exception:  # noqa: BLE001 - an unhashable hyperparameter: that candidate is not remembered
        return None
    return key


def _scoring_key(search: Any) -> Hashable:
    scoring = search.scoring
    try:
        hash(scoring)
        return scoring if not callable(scoring) else ("callable", id(scoring))
    except TypeError:
        return ("value", repr(scoring))


def of(search: Any, X: Any, y: Any, fit_params: dict[str, Any], score_params: dict[str, Any],
       scorers: Any) -> Memory:
    """The search's memory for this data, a new one when the context changed."""
    context = (fingerprint(X), fingerprint(y) if y is not None else None,
               tuple(sorted((k, fingerprint(v)) for k, v in fit_params.items())),
               tuple(sorted((k, fingerprint(v)) for k, v in score_params.items())),
               _scoring_key(search), bool(search.return_train_score), repr(search.error_score))
    mem = search.__dict__.get("_gn_memory")
    if mem is None or mem.context != context:
        mem = Memory(context)
        search.__dict__["_gn_memory"] = mem
    return mem


def is_dask(executor: Any) -> bool:
    """Whether the search runs on Dask (its tasks run in other processes)."""
    if executor is None:
        from gpunets.base.config import get_config

        executor = get_config().get("executor")
    if isinstance(executor, str):
        return executor == "dask"
    return "dask" in type(executor).__module__


class Recorded:
    """A score task's function that also hands its result to ``record(candidate, fold, out)``."""

    def __init__(self, fn: Any, record: Any, pair: tuple[int, int]) -> None:
        self.fn, self.record, self.pair = fn, record, pair
        self.__name__ = getattr(fn, "__name__", "task")
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.fn(*args, **kwargs)
        if isinstance(out, dict):
            self.record(*self.pair, out)
        return out


def record_in(score_node: Any, record: Any, pair: tuple[int, int]) -> None:
    """Make ``score_node`` (a node of its own: one (candidate, fold)'s score) record its result as it runs."""
    from gpunets.core.nodes import Node

    if isinstance(score_node, Node) and callable(score_node.operation):
        score_node.operation = Recorded(score_node.operation, record, pair)

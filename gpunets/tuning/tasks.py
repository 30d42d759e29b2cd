"""The functions the search network's nodes run, and how steps are compared.

Module-level functions so that the network pickles (Dask).  A fit or score that raises returns a
:class:`Failed` value instead, passed downstream, so one failing candidate never stops the others.
"""

from __future__ import annotations

import time
import traceback
from typing import Any, NamedTuple

import numpy as np
from sklearn.model_selection._validation import _score

from ..data import check_placeable, take_rows
from ..estimators import apply_estimator
from ..nodes import source
from ..models import fit_context, prepare_inputs
from ..saved import saved_operation

__all__ = ["Failed", "Replay", "Stage", "fn_key", "step_key"]


# --- the values flowing through the search network (module level, so they pickle for Dask) -------------

class Failed:
    """A fit or a score that raised: the exception and its traceback, passed downstream instead of a value."""

    def __init__(self, error: BaseException, tb: str, seconds: float = 0.0) -> None:
        self.error, self.tb, self.seconds = error, tb, seconds


class Stage(NamedTuple):
    """What a fitted upstream step passes on, in one value: its transforms of the fold's training rows,
    test rows and (with train scores) training rows to score, and the fit seconds of every step so far.
    The fitted step itself is not kept: nothing downstream needs it.  A named tuple, so a move to
    another device moves its arrays (:func:`gpunets.data.to_device` moves tuples item by item)."""

    train: Any
    test: Any
    score: Any
    seconds: tuple[float, ...]


def aligned(*values: Any) -> tuple[Any, ...]:
    """``values``, each NumPy array that is not aligned for its dtype copied into one that is.

    Arrays that Dask moves between workers can arrive at any byte offset; NumPy and BLAS take other code
    paths on such memory and may round differently, so a score computed from them could differ from the
    serial search's in the last bit.

    >>> raw = np.zeros(8 * 4 + 1, dtype=np.uint8)[1:].view(np.float64)
    >>> raw.flags.aligned, aligned(raw)[0].flags.aligned
    (False, True)
    """
    return tuple(v.copy() if isinstance(v, np.ndarray) and not v.flags.aligned else v for v in values)


@saved_operation
def take(value: Any, rows: np.ndarray) -> Any:
    """``value`` at ``rows``: gpunets' type-aware selection, scikit-learn's for lists and the like."""
    if value is None:
        return None
    try:
        return take_rows(value, rows)
    except TypeError:
        from sklearn.utils import _safe_indexing

        return _safe_indexing(value, rows)


@saved_operation
def take_pairwise(value: Any, rows: np.ndarray, columns: np.ndarray) -> Any:
    """Rows of a precomputed kernel, restricted to the training columns (scikit-learn's ``_safe_split``)."""
    return take(value, rows)[:, columns]


def as_node(value: Any, name: str) -> Any:
    """A source for data gpunets can place; the data itself (a constant) for lists and other sequences."""
    if value is None:
        return None
    try:
        check_placeable(value, what=name, device="cpu")
    except TypeError:
        return value
    return source(value, name=name)


def on_device(route: Any) -> Any:
    """The context a step runs in: :func:`gpunets.models.fit_context` of its route; nothing on the CPU."""
    import contextlib

    if route is None:
        return contextlib.nullcontext()
    return fit_context(route)


def moved(route: Any, *values: Any) -> tuple[Any, ...]:
    """``values`` where the step's route runs (CuPy on a GPU route); unchanged on the CPU."""
    if route is None:
        return values
    keep = [v is None or isinstance(v, Failed) for v in values]
    out = prepare_inputs(route, *(None if k else v for k, v in zip(keep, values)))
    return tuple(v if k else o for k, v, o in zip(keep, values, out))


@saved_operation
def fit_step(est: Any, route: Any, last: bool, fit_params: dict[str, Any], X: Any,
             y: Any) -> tuple[Any, Any, float]:
    """Fit one step: ``(fitted, transformed training rows or None, seconds)``, as Pipeline's fit does.

    ``route`` is the step's :class:`~gpunets.models.Resolved` on a GPU (its estimator is the one fitted),
    None on the CPU; ``X`` is the training rows, or the previous step's :class:`Stage`.
    """
    from sklearn.base import clone

    if isinstance(X, Stage):
        X = X.train
    if isinstance(X, Failed):
        return X, X, 0.0
    X, y = aligned(X, y)
    fit_params = dict(zip(fit_params, aligned(*fit_params.values())))
    start = time.perf_counter()
    est = clone(est if route is None else route.estimator)  # the fitted copy is dropped once no score needs it
    try:
        with on_device(route):
            X, y = moved(route, X, y)
            return _fit_step(est, last, fit_params, X, y, start)
    except Exception as e:  # noqa: BLE001 - reported by candidate through error_score
        failed = Failed(e, traceback.format_exc(), time.perf_counter() - start)
        return failed, failed, failed.seconds


def _fit_step(est: Any, last: bool, fit_params: dict[str, Any], X: Any, y: Any,
              start: float) -> tuple[Any, Any, float]:
    if last:
        est.fit(X, **fit_params) if y is None else est.fit(X, y, **fit_params)
        out = None
    elif hasattr(est, "fit_transform"):
        out = est.fit_transform(X, y, **fit_params)
    else:
        out = est.fit(X, y, **fit_params).transform(X)
    return est, out, time.perf_counter() - start


def fitted(step: tuple[Any, Any, float]) -> Any:
    return step[0]


def seconds(step: tuple[Any, Any, float]) -> float:
    return step[2]


@saved_operation
def transform(est: Any, X: Any, route: Any = None) -> Any:
    if isinstance(est, Failed):
        return est
    if isinstance(X, Failed):
        return X
    try:
        with on_device(route):
            return est.transform(*moved(route, X))
    except Exception as e:  # noqa: BLE001
        return Failed(e, traceback.format_exc())


@saved_operation
def fit_stage(est: Any, route: Any, fit_params: dict[str, Any], score: bool, y: Any, X: Any, X_test: Any = None,
              X_score: Any = None) -> Stage:
    """Fit an upstream step and transform the test rows (and, if ``score``, the training rows to score) in
    one task.  ``X`` is the fold's training rows (then ``X_test``, ``X_score`` are given) or the previous
    step's :class:`Stage`."""
    secs: tuple[float, ...] = ()
    if isinstance(X, Stage):
        X, X_test, X_score, secs = X.train, X.test, X.score, X.seconds
    X_test, X_score = aligned(X_test, X_score)
    est, out, seconds = fit_step(est, route, False, fit_params, X, y)
    return Stage(out, transform(est, X_test, route), transform(est, X_score, route) if score else None,
                 secs + (seconds,))


def score_on(route: Any, *args: Any) -> dict[str, Any]:
    """:func:`score_one` in the last step's route (its data moved there), for a search on a GPU."""
    with on_device(route):
        values = list(args)
        values[7:11] = moved(route, *values[7:11])  # X_test, y_test, X_train, y_train
        return score_one(*values)


@saved_operation
def score_one(scorer: Any, error_score: Any, train: bool, n_test: int, n_scores: tuple[str, ...] | None,
              score_params: tuple[dict[str, Any], dict[str, Any]] | None, est: Any, X_test: Any, y_test: Any,
              X_train: Any, y_train: Any, *seconds: float) -> dict[str, Any]:
    """One entry of scikit-learn's ``_fit_and_score`` output for one (candidate, fold).

    ``score_params`` is ``(test, train)``: the scorer's parameters (``sample_weight``) for those rows.
    """
    sp_test, sp_train = score_params or ({}, {})
    fit_time = float(sum(seconds))
    failed = next((v for v in (est, X_test, X_train) if isinstance(v, Failed)), None)
    out: dict[str, Any] = {"n_test_samples": n_test, "fit_time": fit_time}
    if failed is not None:
        err = error_score if n_scores is None else {name: error_score for name in n_scores}
        out.update(fit_error=failed.tb, test_scores=err, score_time=0.0, _error=failed.error)
        if train:
            out["train_scores"] = err
        return out
    start = time.perf_counter()
    try:
        out["test_scores"] = _score(est, X_test, y_test, scorer, sp_test, error_score)
        if train:
            out["train_scores"] = _score(est, X_train, y_train, scorer, sp_train, error_score)
    except Exception as e:  # noqa: BLE001 - error_score="raise": raised by the search, by candidate
        err = error_score if n_scores is None else {name: error_score for name in n_scores}
        out.update(fit_error=traceback.format_exc(), test_scores=err, score_time=0.0, _error=e)
        if train:
            out["train_scores"] = err
        return out
    out["score_time"] = time.perf_counter() - start
    out["fit_error"] = None
    return out


@saved_operation
def score_fit(route: Any, users: tuple[int, ...], head: tuple[Any, ...], step: tuple[Any, Any, float],
              X_test: Any, y_test: Any, X_train: Any, y_train: Any, *upstream_seconds: float) -> dict[str, Any]:
    """:func:`score_one` (:func:`score_on` on a GPU route) of a fitted last step ``step``, as :func:`fit_step`
    returned it; ``head`` is score_one's first six arguments, the fit time the candidate's share of the
    upstream steps' ``upstream_seconds`` and of the last step's (``users``: candidates sharing each).
    ``X_test`` may be the previous step's :class:`Stage` (then ``X_train`` and the seconds come from it)."""
    if isinstance(X_test, Stage):   # the previous step's: its test rows, training rows to score, fit seconds
        X_test, X_train, upstream_seconds = X_test.test, X_test.score, X_test.seconds
    est, _, secs = step
    X_test, y_test, X_train, y_train = aligned(X_test, y_test, X_train, y_train)
    if head[5] is not None:   # the scorer's sample weights, (test, train)
        head = (*head[:5], tuple(dict(zip(p, aligned(*p.values()))) for p in head[5]))
    args = (*head, est, X_test, y_test, X_train, y_train, share_seconds(users, *upstream_seconds, secs))
    return score_one(*args) if route is None else score_on(route, *args)


@saved_operation
def fit_and_score(est: Any, route: Any, fit_params: dict[str, Any], X: Any, y: Any, users: tuple[int, ...],
                  head: tuple[Any, ...], X_test: Any, y_test: Any, X_train: Any, y_train: Any,
                  *upstream_seconds: float) -> dict[str, Any]:
    """Fit the last step of one candidate and score it, in one task: :func:`fit_step` then :func:`score_fit`.

    ``X`` is the fold's training rows, or the previous step's :class:`Stage` (which then also gives the
    test rows, the training rows to score and the upstream fit seconds)."""
    step = fit_step(est, route, True, fit_params, X, y)
    if isinstance(X, Stage):
        X_test = X
    return score_fit(route, users, head, step, X_test, y_test, X_train, y_train, *upstream_seconds)


@saved_operation
def constant(value: Any) -> Any:
    """``value`` itself: a node holding a fold's parameters, so that tasks share it instead of each embedding it."""
    return value


@saved_operation
def share_seconds(users: tuple[int, ...], *seconds: float) -> float:
    """A candidate's fit time: each fit it needed, divided among the candidates of the fold that share it.

    >>> share_seconds((4, 1), 2.0, 0.5)
    1.0
    """
    return float(sum(s / n for s, n in zip(seconds, users)))


@saved_operation
def collect(*outs: dict[str, Any]) -> list[dict[str, Any]]:
    return list(outs)


# --- comparing steps --------------------------------------------------------------------------------------------

def _is_estimator(v: Any) -> bool:
    return not isinstance(v, type) and callable(getattr(v, "get_params", None))


def step_key(v: Any) -> Any:
    """A hashable summary of a step: class and ``get_params(deep=False)``, estimators recursively.

    >>> from sklearn.linear_model import Ridge
    >>> step_key(Ridge(alpha=2.0)) == step_key(Ridge(alpha=2.0)), step_key(Ridge()) == step_key(Ridge(alpha=2.0))
    (True, False)
    """
    if _is_estimator(v):
        params = v.get_params(deep=False)
        return ("estimator", type(v), tuple(sorted((k, step_key(p)) for k, p in params.items())))
    if isinstance(v, (list, tuple)):
        return (type(v), tuple(step_key(x) for x in v))
    if isinstance(v, dict):
        return (dict, tuple(sorted((repr(k), step_key(x)) for k, x in v.items())))
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, v.shape, v.tobytes())
    try:
        hash(v)
    except TypeError:
        return ("object", id(v))  # unhashable, unknown: never shared
    if isinstance(v, float) and np.isnan(v):
        return ("nan",)
    return (type(v), v)




def fn_key(f: Any) -> Any:
    """A hashable summary of a node's operation: partials by function and arguments, others by equality."""
    import functools

    if isinstance(f, functools.partial):
        return ("partial", fn_key(f.func), step_key(f.args), step_key(f.keywords))
    try:
        hash(f)
    except TypeError:
        return ("object", id(f))
    return f


# --- composites: their network's machines and nodes, one by one ---------------------------------------------

def _first_failed(values: tuple[Any, ...]) -> Any:
    return next((v for v in values if isinstance(v, Failed)), None)


@saved_operation
def fit_model(est: Any, *values: Any, keywords: tuple[str, ...] = ()) -> tuple[Any, None, float]:
    """Fit one machine of a composite's network (a fresh clone of its model): ``(fitted, None, seconds)``.

    The last ``len(keywords)`` values are passed by those names (the machine's ``fit_keywords``)."""
    failed = _first_failed(values)
    if failed is not None:
        return failed, None, 0.0
    from sklearn.base import clone

    start = time.perf_counter()
    try:
        values = aligned(*values)
        n = len(values) - len(keywords)
        return clone(est).fit(*values[:n], **dict(zip(keywords, values[n:]))), None, time.perf_counter() - start
    except Exception as e:  # noqa: BLE001 - reported by candidate
        failed = Failed(e, traceback.format_exc(), time.perf_counter() - start)
        return failed, None, failed.seconds


@saved_operation
def apply_op(op: str, est: Any, *values: Any) -> Any:
    """A machine operation (``predict``, ``transform``...) of a fitted model."""
    failed = _first_failed((est, *values))
    if failed is not None:
        return failed
    try:
        return apply_estimator(est, op, aligned(*values))
    except Exception as e:  # noqa: BLE001
        return Failed(e, traceback.format_exc())


@saved_operation
def call_fn(fn: Any, *values: Any) -> Any:
    """A plain node of a composite's network (``gn.node(fn, ...)``, ``gn.mean``...)."""
    failed = _first_failed(values)
    if failed is not None:
        return failed
    try:
        return fn(*values)
    except Exception as e:  # noqa: BLE001
        return Failed(e, traceback.format_exc())


class Replay:
    """A fitted composite, as scorers see it: its operations return the values the network computed.

    ``spec`` is the candidate (validated on the fold, so ``classes_``... are set); attributes not
    computed come from it, and scikit-learn's ``score`` of its class runs on this object.
    """

    _OPS = ("predict", "predict_proba", "predict_log_proba", "decision_function", "transform",
            "inverse_transform")

    def __init__(self, spec: Any, values: dict[str, Any]) -> None:
        self._spec, self._values = spec, values

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name in values:
            def method(*args: Any, **kw: Any) -> Any:
                return values[name]

            method.__name__ = name
            return method
        if name in Replay._OPS or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.__dict__["_spec"], name)

    def __sklearn_tags__(self) -> Any:
        return self._spec.__sklearn_tags__()

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        return type(self._spec).score(self, X, y, sample_weight=sample_weight)


@saved_operation
def score_replay(spec: Any, ops: tuple[str, ...], scorer: Any, error_score: Any, train: bool, n_test: int,
                 n_scores: tuple[str, ...] | None, fit_seconds: float, y_test: Any, y_train: Any,
                 *values: Any) -> dict[str, Any]:
    """:func:`score_one` for a composite: ``values`` are its operations on the test (then train) rows."""
    k = len(ops)
    test = dict(zip(ops, values[:k]))
    train_values = dict(zip(ops, values[k:2 * k])) if train else {}
    failed = _first_failed(tuple(test.values()) + tuple(train_values.values()))
    est = failed if failed is not None else Replay(spec, test)
    out = score_one(scorer, error_score, False, n_test, n_scores, None, est, None, y_test, None, None, fit_seconds)
    if train:
        tr = failed if failed is not None else Replay(spec, train_values)
        out["train_scores"] = score_one(scorer, error_score, False, n_test, n_scores, None, tr, None, y_train, None,
                                        None)["test_scores"]
    return out

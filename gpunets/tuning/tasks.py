"""The functions the search network's nodes run, and how steps are compared.

Module-level functions so that the network pickles (Dask).  A fit or score that raises returns a
:class:`Failed` value instead, passed downstream, so one failing candidate never stops the others.
"""

from __future__ import annotations

import time
import traceback
from typing import Any, NamedTuple

import numpy as np

from gpunets.base.saved import saved_operation
from gpunets.compute.estimators import (
    apply_estimator,
    own_inputs,
    training_output_differs,
    transform_gives,
    writes_inputs,
)
from gpunets.compute.models import fit_context, prepare_inputs
from gpunets.core.machines import OPERATIONS
from gpunets.core.nodes import source
from gpunets.devices.data import check_placeable, take_rows
from gpunets.tuning import dropin, stored
from gpunets.tuning.failed import Failed, Portable, rebuild_error, unwrap_error  # noqa: F401 - path of old files
from gpunets.tuning.scoring import Raising, score_noting, score_one  # noqa: F401 - path of old files

__all__ = ["Failed", "Replay", "Stage", "fn_key", "step_key"]


# --- the values flowing through the search network (module level, so they pickle for Dask) -------------

class Stage(NamedTuple):
    """What a fitted upstream step passes on, in one value: its transforms of the fold's training rows,
    test rows and (with train scores) training rows to score, and the fit seconds of every step so far.
    The fitted step itself is not kept: nothing downstream needs it.  A named tuple, so a move to
    another device moves its arrays (:func:`gpunets.devices.data.to_device` moves tuples item by item)."""

    train: Any
    test: Any
    score: Any
    seconds: tuple[float, ...]
    key: Any = None   # the store key of the values it holds (:mod:`gpunets.tuning.stored`), or None
    loaded: tuple[Any, ...] = ()   # what its chain's tasks did with the store (stored.Done: counted once each)


class Deferred:
    """A loaded step's output on its training rows, computed only when a later step needs it: with a store that
    keeps training outputs (``gn.Store(path, outputs=True)``) the later step, loaded too, may find its own
    output there, and then this one is never computed.  Computed once in a process (:meth:`compute`); a copy
    sent to another process computes its own."""

    def __init__(self, est: Any, fit_params: dict[str, Any], X: Any, y: Any, same: bool, key: Any,
                 depth: int) -> None:
        import threading

        self.args = (est, fit_params, X, y, same, key, depth)
        self._lock = threading.Lock()
        self._value: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"args": self.args, "_value": self._value}

    def __setstate__(self, state: dict[str, Any]) -> None:
        import threading

        self.__dict__.update(state)
        self._lock = threading.Lock()

    def compute(self) -> tuple[Any, tuple[Any, ...]]:
        """``(the output, what computing it did: stored.Done values)``; what it did is told once, to the first
        caller in this process (the others are given the output only)."""
        with self._lock:
            if self._value is not None:
                return self._value, ()
            est, fit_params, X, y, same, key, depth = self.args
            kept = stored.load_output(key) if training_output_differs(est) else None
            if kept is not None:   # the upstream rows are not needed
                self._value = kept
                return kept, (stored.done("output", depth),)
            X, before = materialize(X)
            out, did = _training_rows(est, fit_params, X, y, same, None, depth)
            if did:   # fitted again: kept where the store keeps outputs
                stored.keep_output(key, out)
            self._value = out
            return out, before + did


def materialize(X: Any) -> tuple[Any, tuple[Any, ...]]:
    """``(X, ())``, or a :class:`Deferred` output computed: ``(its value, what computing it did)``."""
    if isinstance(X, Deferred):
        return X.compute()
    return X, ()


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
    """The context a step runs in: :func:`gpunets.compute.models.fit_context` of its route; nothing on the CPU."""
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
             y: Any, own: bool = False) -> tuple[Any, Any, float, tuple[Any, ...]]:
    """Fit one step: ``(fitted, transformed training rows or None, seconds, loaded)``, as Pipeline's fit does
    (``loaded``: what it did with the store, :class:`~gpunets.tuning.stored.Done` values, see :attr:`Stage.loaded`).

    ``route`` is the step's :class:`~gpunets.compute.models.Resolved` on a GPU (its estimator is the one fitted),
    None on the CPU; ``X`` is the training rows, or the previous step's :class:`Stage`; ``own``: ``X`` is this
    fit's own copy (else a step that writes its input, :func:`~gpunets.compute.estimators.own_inputs`, gets one).
    """
    est, out, secs, _, loaded = _keyed_fit_step(est, route, last, fit_params, X, y, own=own)
    return est, out, secs, loaded


def _keyed_fit_step(est: Any, route: Any, last: bool, fit_params: dict[str, Any], X: Any, y: Any,
                    x_key: bytes | None = None, own: bool = False,
                    lookup: Any = None, depth: int = 0,
                    defer: bool = False) -> tuple[Any, Any, float, Any, tuple[Any, ...]]:
    """:func:`fit_step`, its store key and what it did with the store (:class:`~gpunets.tuning.stored.Done`
    values): a step stored under that key is loaded, not fitted (docs/store.md).  ``x_key``: the key of the rows
    ``X`` (a :class:`Stage` carries its own); ``lookup``: what :func:`~gpunets.tuning.stored.load_step` gave for
    it already; ``depth``: the step's place in its pipeline (a :class:`Stage` gives it); ``defer``: a loaded
    upstream step may pass on its training output as a :class:`Deferred` (a store that keeps outputs)."""
    from sklearn.base import clone

    if isinstance(X, Stage):
        X, x_key, depth = X.train, X.key, len(X.seconds)
    if isinstance(X, Failed):
        X = X.as_fit()
        return X, X, 0.0, None, ()
    X, y = aligned(X, y)
    fit_params = dict(zip(fit_params, aligned(*fit_params.values())))
    start = time.perf_counter()
    hit, key, same = stored.load_step(est, route, fit_params, X, y, x_key) if lookup is None else lookup
    est = hit if hit is not None else clone(est if route is None else route.estimator)
    before: tuple[Any, ...] = ()
    try:
        if hit is not None:
            loaded = (stored.done("loaded", depth),)
            if last:
                return est, None, time.perf_counter() - start, key, loaded
            if defer and route is None and stored.outputs_kept():
                # computed (or read from the store) only if no later step's kept output will do
                out = Deferred(est, fit_params, X, y, same, key, depth)
                return est, out, time.perf_counter() - start, key, loaded
            kept = stored.load_output(key) if route is None and training_output_differs(est) else None
            if kept is not None:   # its fit's output, kept by a store that keeps outputs: the rows are not needed
                return est, kept, time.perf_counter() - start, key, (*loaded, stored.done("output", depth))
        X, before = materialize(X)
        X = aligned(X)[0]
        with on_device(route):
            X, y = moved(route, X, y)
            if hit is not None:   # loaded: only the training rows' output is left to compute
                out, did = _training_rows(est, fit_params, X, y, same, None, depth)
                if did:   # a fit run again for its output: kept where the store keeps outputs
                    stored.keep_output(key if route is None else None, out)
                return est, out, time.perf_counter() - start, key, (*before, *loaded, *did)
            out = _fit_step(est, last, fit_params, X, y, start, own)
            same = (key is not None and not last and training_output_differs(est)   # read only from the store
                    and transform_gives(est, X, out[1]))
        stored.keep_step(key, est, route, same)
        if not last and route is None and training_output_differs(est):
            stored.keep_output(key, out[1])   # only where the store keeps outputs (gn.Store(outputs=True))
        return (*out, key, before)
    except Exception as e:  # noqa: BLE001 - reported by candidate through error_score
        failed = Failed(e, traceback.format_exc(), time.perf_counter() - start)
        return failed, failed, failed.seconds, None, ()


def _training_rows(est: Any, fit_params: dict[str, Any], X: Any, y: Any, same: bool, key: Any = None,
                   depth: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """A loaded step's output on its training rows, as its fit gave it, and what that took
    (:class:`~gpunets.tuning.stored.Done` values): ``transform``; where ``fit_transform`` may differ
    (``TargetEncoder``, ``PCA``) the output kept with the fit under ``key`` (``gn.Store(path, outputs=True)``),
    else ``fit_transform`` on a copy, a fit that runs (``"again"``; the copy is dropped; gpunets.planning.outputs
    says why)."""
    from sklearn.base import clone

    if same or not training_output_differs(est):
        return est.transform(*own_inputs(est, (X,))), ()
    kept = stored.load_output(key)
    if kept is not None:
        return kept, (stored.done("output", depth),)
    start = time.perf_counter()
    out = _fit_step(clone(est), False, fit_params, X, y, 0.0)[1]
    return out, (stored.done("again", depth, time.perf_counter() - start),)


def _fit_step(est: Any, last: bool, fit_params: dict[str, Any], X: Any, y: Any,
              start: float, own: bool = False) -> tuple[Any, Any, float]:
    if not own:   # the fold's rows are shared: a step with copy=False gets its own
        X, = own_inputs(est, (X,))
    if last:   # a candidate's estimator: its evaluation's callback hooks (scikit-learn's _fit_and_score)
        with dropin.fitting(est, X, y, fit_params):
            est.fit(X, **fit_params) if y is None else est.fit(X, y, **fit_params)
        out = None
    elif hasattr(est, "fit_transform"):
        out = est.fit_transform(X, y, **fit_params)
    else:
        out = est.fit(X, y, **fit_params).transform(X)
    return est, out, time.perf_counter() - start


def fitted(step: tuple[Any, ...]) -> Any:
    return step[0]


def seconds(step: tuple[Any, ...]) -> float:
    return step[2]


@saved_operation
def transform(est: Any, X: Any, route: Any = None) -> Any:
    if isinstance(est, Failed):
        return est
    if isinstance(X, Failed):
        return X
    try:
        with on_device(route):
            return est.transform(*own_inputs(est, moved(route, X)))
    except Exception as e:  # noqa: BLE001
        return Failed(e, traceback.format_exc(), fit=False)


@saved_operation
def fit_stage(est: Any, route: Any, fit_params: dict[str, Any], score: bool, y: Any, X: Any, X_test: Any = None,
              X_score: Any = None) -> Stage:
    """Fit an upstream step and transform the test rows (and, if ``score``, the training rows to score) in
    one task.  ``X`` is the fold's training rows (then ``X_test``, ``X_score`` are given) or the previous
    step's :class:`Stage`."""
    secs: tuple[float, ...] = ()
    before: tuple[bytes, ...] = ()
    x_key = None
    if isinstance(X, Stage):   # the previous step's: its key names the rows this step fits on
        X, X_test, X_score, secs, before, x_key = X.train, X.test, X.score, X.seconds, X.loaded, X.key
    same = X_score is X   # the rows to score are the training rows (train scores)
    X_test, X_score = aligned(X_test, X_score)
    est, out, seconds, key, loaded = _keyed_fit_step(est, route, False, fit_params, X, y, x_key, depth=len(secs),
                                                     defer=not score)
    if same and writes_inputs(est) and not isinstance(out, Failed):
        # scikit-learn's _fit_and_score scores the X_train its fit wrote into (copy=False): the rows are
        # this fit's output, transformed again
        scored = transform(est, out, route) if score else None
    else:
        scored = (out if same and fit_output_is_transform(est) else transform(est, X_score, route)) if score else None
    return Stage(out, transform(est, X_test, route), scored, secs + (seconds,), stored.stage_key(key),
                 before + loaded)


def fit_output_is_transform(est: Any) -> bool:
    """Whether ``est``'s fit output (:func:`fit_step`) is by construction its ``transform`` of the same rows
    (:func:`~gpunets.compute.estimators.training_output_differs`: scikit-learn's ``TransformerMixin.fit_transform``
    is ``fit(X, y).transform(X)``; an override, PCA's ``U * S``, may round otherwise)."""
    return not isinstance(est, Failed) and not training_output_differs(est)


def score_on(route: Any, *args: Any) -> dict[str, Any]:
    """:func:`score_one` in the last step's route (its data moved there), for a search on a GPU."""
    with on_device(route):
        values = list(args)
        values[7:11] = moved(route, *values[7:11])  # X_test, y_test, X_train, y_train
        return score_one(*values)


@saved_operation
def score_fit(route: Any, users: tuple[int, ...], head: tuple[Any, ...], step: tuple[Any, ...],
              X_test: Any, y_test: Any, X_train: Any, y_train: Any, *upstream_seconds: float) -> dict[str, Any]:
    """:func:`score_one` (:func:`score_on` on a GPU route) of a fitted last step ``step``, as :func:`fit_step`
    returned it; ``head`` is score_one's first six arguments, the fit time the candidate's share of the
    upstream steps' ``upstream_seconds`` and of the last step's (``users``: candidates sharing each).
    ``X_test`` may be the previous step's :class:`Stage` (then ``X_train`` and the seconds come from it)."""
    loaded = step[3] if len(step) > 3 else ()
    if isinstance(X_test, Stage):   # the previous step's: its test rows, training rows to score, fit seconds
        X_test, X_train, upstream_seconds, loaded = X_test.test, X_test.score, X_test.seconds, X_test.loaded + loaded
    est, secs = step[0], step[2]
    X_test, y_test, X_train, y_train = aligned(X_test, y_test, X_train, y_train)
    if head[5] is not None:   # the scorer's sample weights, (test, train)
        head = (*head[:5], tuple(dict(zip(p, aligned(*p.values()))) for p in head[5]))
    args = (*head, est, X_test, y_test, X_train, y_train, share_seconds(users, *upstream_seconds, secs))
    out = score_one(*args) if route is None else score_on(route, *args)
    if loaded:   # the step fits loaded from the store (the search counts them, also from Dask workers)
        out["_stored"] = loaded
    return out


@saved_operation
def fit_and_score(est: Any, route: Any, fit_params: dict[str, Any], X: Any, y: Any, users: tuple[int, ...],
                  head: tuple[Any, ...], X_test: Any, y_test: Any, X_train: Any, y_train: Any,
                  *upstream_seconds: float) -> dict[str, Any]:
    """Fit the last step of one candidate and score it, in one task: :func:`fit_step` then :func:`score_fit`.

    ``X`` is the fold's training rows, or the previous step's :class:`Stage` (which then also gives the
    test rows, the training rows to score and the upstream fit seconds)."""
    own = False
    if X_train is X and not isinstance(X, Stage) and route is None:
        # the candidate's own copy of its rows where its fit writes them (copy=False), scored afterwards as
        # scikit-learn's _fit_and_score scores the very X_train its fit was given
        fit_rows = own_inputs(est, (X,))[0]
        own = fit_rows is not X
        X = X_train = fit_rows
    step = fit_step(est, route, True, fit_params, X, y, own=own)
    if isinstance(X, Stage):
        X_test = X
    return score_fit(route, users, head, step, X_test, y_test, X_train, y_train, *upstream_seconds)


class Configured:
    """``fn`` run under scikit-learn's configuration ``config`` (its metadata routing...): scikit-learn's
    configuration is per thread, and a search's tasks run on the executor's threads or workers."""

    def __init__(self, fn: Any, config: dict[str, Any]) -> None:
        self.fn, self.config = fn, config
        self.__name__ = getattr(fn, "__name__", getattr(getattr(fn, "func", None), "__name__", "task"))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import sklearn

        with sklearn.config_context(**self.config):
            return self.fn(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Configured) and self.fn == other.fn and self.config == other.config

    def __hash__(self) -> int:
        return hash(self.fn)


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


_PARAM_NAMES: dict[type, tuple[str, ...]] = {}


def _shallow_params(v: Any) -> dict[str, Any]:
    """``v.get_params(deep=False)``; for scikit-learn's own ``BaseEstimator.get_params``, its parameter names
    read once per class (it inspects the ``__init__`` signature at every call)."""
    from sklearn.base import BaseEstimator  # lazy: scikit-learn is imported by the searches that compare steps

    cls = type(v)
    if getattr(cls, "get_params", None) is not BaseEstimator.get_params:
        return v.get_params(deep=False)
    names = _PARAM_NAMES.get(cls)
    if names is None:
        names = _PARAM_NAMES[cls] = tuple(cls._get_param_names())
    return {k: getattr(v, k) for k in names}


def step_key(v: Any) -> Any:
    """A hashable summary of a step: class and ``get_params(deep=False)``, estimators recursively.

    >>> from sklearn.linear_model import Ridge
    >>> step_key(Ridge(alpha=2.0)) == step_key(Ridge(alpha=2.0)), step_key(Ridge()) == step_key(Ridge(alpha=2.0))
    (True, False)
    """
    if _is_estimator(v):
        params = _shallow_params(v)
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
        return failed.as_fit(), None, 0.0
    from sklearn.base import clone

    start = time.perf_counter()
    try:
        values = aligned(*values)
        n = len(values) - len(keywords)
        values = (*own_inputs(est, values[:n]), *values[n:])
        return clone(est).fit(*values[:n], **dict(zip(keywords, values[n:]))), None, time.perf_counter() - start
    except Exception as e:  # noqa: BLE001 - reported by candidate
        failed = Failed(e, traceback.format_exc(), time.perf_counter() - start)
        return failed, None, failed.seconds


@saved_operation
def frozen_model(est: Any) -> tuple[Any, None, float]:
    """A frozen component of a composite: its fitted estimator as is, as :func:`fit_model` returns a fit."""
    return est, None, 0.0


@saved_operation(checked={0: "operation"})
def apply_op(op: str, est: Any, *values: Any) -> Any:
    """A machine operation (``predict``, ``transform``...: one of :data:`~gpunets.core.machines.OPERATIONS`, never
    another method) of a fitted model."""
    if op not in OPERATIONS:
        msg = f"apply_op: {op!r} is not a machine operation; operations are {list(OPERATIONS)}."
        raise ValueError(msg)
    failed = _first_failed((est, *values))
    if failed is not None:
        return failed
    try:
        return apply_estimator(est, op, aligned(*values))
    except Exception as e:  # noqa: BLE001
        return Failed(e, traceback.format_exc(), fit=False)


@saved_operation(checked={0: "callable"})
def call_fn(fn: Any, *values: Any) -> Any:
    """A plain node of a composite's network (``gn.node(fn, ...)``, ``gn.mean``...)."""
    failed = _first_failed(values)
    if failed is not None:
        return failed
    try:
        return fn(*values)
    except Exception as e:  # noqa: BLE001
        return Failed(e, traceback.format_exc(), fit=False)


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


@saved_operation(checked={1: "operations", 2: "callable"})
def score_replay(spec: Any, ops: tuple[str, ...], scorer: Any, error_score: Any, train: bool, n_test: int,
                 n_scores: tuple[str, ...] | None, fit_seconds: float, y_test: Any, y_train: Any,
                 *values: Any) -> dict[str, Any]:
    """:func:`score_one` for a composite: ``values`` are its operations on the test (then train) rows."""
    k = len(ops)
    test = dict(zip(ops, values[:k]))
    train_values = dict(zip(ops, values[k:2 * k])) if train else {}
    failed = _first_failed(tuple(test.values()) + tuple(train_values.values()))
    if failed is not None and failed.fit:   # a machine's fit failed: a fit failure
        return score_one(scorer, error_score, train, n_test, n_scores, None, failed, None, None, None, None,
                         fit_seconds)
    # an operation on the rows to score failed: a score failure of those rows (see score_one)
    bad_test, bad_train = _first_failed(tuple(test.values())), _first_failed(tuple(train_values.values()))
    out = score_one(scorer, error_score, False, n_test, n_scores, None, Replay(spec, test),
                    bad_test, y_test, None, None, fit_seconds)
    if train and "_raise" not in out:
        tr = score_one(scorer, error_score, False, n_test, n_scores, None, Replay(spec, train_values),
                       bad_train, y_train, None, None)
        out["train_scores"] = tr["test_scores"]
        for key in ("_raise", "_warnings"):
            if key in tr:
                out[key] = out.get(key, []) + tr[key] if key == "_warnings" else tr[key]
    elif train:
        out["train_scores"] = out["test_scores"]
    return out

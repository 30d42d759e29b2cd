"""Candidates of a search fitted and scored together: last steps that differ only in a parameter a rule knows.

A search over ``ridge__alpha`` fits, per fold, one ``Ridge`` per alpha on the same rows.  Everything but the
last solve is the same in each of those fits (the rows validated and centred, the Gram matrix ``XᵀX``, ``Xᵀy``),
and so is the scoring's work around the prediction (the metric's input checks).  Where a **batch rule** knows
the estimator, the search's network fits such a group of last steps in one task: the shared part once, the part
that depends on the parameter per candidate, each step of it the very call scikit-learn makes, so every fitted
candidate equals its own ``fit`` bit for bit.  Its scores then come from one call of the metric over the
candidates' predictions as columns (``multioutput="raw_values"``), which computes each column as the metric
computes one prediction, where the scorer is one whose metric is known to (:func:`column_metric`).

Nothing here is taken on trust: in the first batch of each kind in a process (the rule or the metric,
scikit-learn's and NumPy's versions, the rows' dtype and memory layout), the first candidate is also fitted,
predicted and scored by scikit-learn itself, and the batch is used only if its results for that candidate are
scikit-learn's **bit for bit**; otherwise (another scikit-learn, another code path) each candidate is fitted and
scored on its own, as without batching, and the kind is checked again next time.  A failure of any kind in a
batch (rows scikit-learn refuses, a singular system) does the same, so errors, ``error_score`` and warnings are
exactly those of candidate-by-candidate fits.

The rules (:data:`RULES`): ``Ridge`` with ``solver="auto"`` or ``"cholesky"`` on dense NumPy rows with more rows
than columns (the Cholesky path of scikit-learn's ``_solve_cholesky``), over any of its parameters except
``alpha`` fixed.  A rule is a class with ``group_key(est)`` (equal keys: candidates that one batch may fit),
``fit(ests, X, y)`` (the fitted candidates, or None to decline) and ``predict(est, X)`` (the prediction as
the estimator's ``predict`` computes it on rows it has validated).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import sklearn
from sklearn.base import clone

from gpunets.base.saved import saved_operation
from gpunets.devices import store as _store
from gpunets.tuning import stored, tasks

__all__ = ["RULES", "RidgeRule", "column_metric", "rule_for"]


def _plain_number(v: Any) -> bool:
    return (isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
            and bool(np.isfinite(v)) and bool(v >= 0))


# kinds of batch (the rule or the metric, scikit-learn's and NumPy's versions, the rows' dtype and layout...) whose
# first batch in this process gave scikit-learn's own results bit for bit: later batches of a kind skip the
# comparison (the value: what the checked result's type was)
_CHECKED: dict[Any, Any] = {}

_RIDGE_PARAMS = ("alpha", "fit_intercept", "copy_X", "max_iter", "tol", "solver", "positive", "random_state")


class RidgeRule:
    """``Ridge`` fits that differ only in ``alpha``: the rows centred and ``XᵀX``, ``Xᵀy`` computed once, then
    per alpha scikit-learn's ``_solve_cholesky`` step (``A + alpha I`` solved with ``assume_a="pos"``) and its
    ``_set_intercept``."""

    name = "ridge (shared Gram matrix across alpha)"

    @staticmethod
    def group_key(est: Any) -> Any:
        return ridge_group_key(est, ("auto", "cholesky"), "Ridge")

    @staticmethod
    def fit(ests: list[Any], X: Any, y: Any, key: bytes | None = None) -> list[Any] | None:
        """Each of ``ests`` fitted on ``X, y``, or None where the rows are not ones the shared path covers, or,
        in a kind's first batch, the first candidate's fit differs from its own ``fit`` by a bit.

        ``key``: where the store in force keeps training outputs (:func:`~gpunets.tuning.stored.shared_key`),
        the shared part (the offsets and scale, ``XᵀX``, ``Xᵀy``: sums of the training rows) is read from the
        store under it, else computed and kept there, so a widened search skips it; the kind's first batch in
        a process still compares its first candidate with scikit-learn's own fit."""
        from scipy import linalg

        target = _target(y)
        if (type(X) is not np.ndarray or target is None or X.ndim != 2
                or X.dtype not in (np.float64, np.float32) or X.shape[0] <= X.shape[1]
                or X.shape[0] != target.shape[0] or not X.flags.writeable or sklearn.get_config()["array_api_dispatch"]):
            return None
        fit_intercept = ests[0].fit_intercept
        kind = ("Ridge.fit", sklearn.__version__, np.__version__, X.dtype.str, X.flags.c_contiguous,
                X.flags.f_contiguous, bool(fit_intercept), type(y).__name__, target.dtype.str)
        # the fitted attributes of a Ridge on dense rows, other than coef_ and intercept_
        attributes = {"n_features_in_": X.shape[1], "n_iter_": None, "solver_": "cholesky"}
        ok, first = check_first(ests, X, y, kind in _CHECKED, attributes)
        if not ok:
            return None
        shared = stored.load_shared(key, kind)
        kept = shared is None
        if shared is None:
            shared = _ridge_sums(X, target, fit_intercept)
        A, Xy, X_offset, y_offset, X_scale = shared
        n_features = A.shape[0]
        dtype = A.dtype
        fitted: list[Any] = []
        for est in ests:
            alpha = np.asarray(est.alpha, dtype=dtype).ravel()
            Ai = A.copy()
            Ai.flat[:: n_features + 1] += alpha[0]
            try:
                coef = linalg.solve(Ai, Xy, assume_a="pos", overwrite_a=True).T
            except linalg.LinAlgError:   # scikit-learn then solves by SVD: its own fit does
                fitted.append(clone(est).fit(X, y))
                continue
            out = clone(est)
            vars(out).update(attributes)
            out.coef_ = np.asarray(np.ravel(coef))
            out._set_intercept(X_offset, y_offset, X_scale)
            fitted.append(out)
        if first is not None:
            if not (np.array_equal(fitted[0].coef_, first.coef_) and np.array_equal(fitted[0].intercept_,
                                                                                     first.intercept_)):
                return None
            _CHECKED[kind] = True
            fitted[0] = first
        if kept:
            stored.keep_shared(key, kind, shared)
        return fitted

    @staticmethod
    def predict(est: Any, X: Any) -> Any:
        """``LinearModel._decision_function`` of rows ``est.predict`` accepts unchanged."""
        return X @ est.coef_ + est.intercept_


def ridge_group_key(est: Any, solvers: tuple[str, ...], tag: str) -> Any:
    """The group key of a ``Ridge`` batch rule: ``(tag, its parameters but alpha)`` for a plain ``Ridge`` with a
    plain-number ``alpha``, a solver in ``solvers``, ``positive=False`` and ``copy_X=True``; else None."""
    from sklearn.linear_model import Ridge  # lazy: scikit-learn's estimators load with the search

    if type(est) is not Ridge:
        return None
    # Ridge's own parameters, read directly (get_params inspects the signature: per candidate and fold)
    params = {k: getattr(est, k) for k in _RIDGE_PARAMS}
    if (not _plain_number(params.pop("alpha")) or params["solver"] not in solvers
            or params["positive"] is not False or params["copy_X"] is not True):
        return None
    return (tag, tuple((k, repr(v)) for k, v in params.items()))


def check_first(ests: list[Any], X: Any, y: Any, checked: bool, attributes: dict[str, Any]) -> tuple[bool, Any]:
    """What a Ridge batch does before its shared work: ``(go on?, the first candidate as scikit-learn fits it,
    or None)``.  In a kind's first batch (``checked`` False) the first candidate is fitted by scikit-learn too,
    and the batch declines where its fitted attributes, other than ``coef_`` and ``intercept_``, are not
    ``attributes``; then each candidate's parameters are validated as its fit's ``_fit_context`` does."""
    first = None
    if not checked:
        first = clone(ests[0]).fit(X, y)
        if {k: v for k, v in vars(first).items() if k.endswith("_") and k not in ("coef_", "intercept_")} \
                != attributes:
            return False, None
    if not sklearn.get_config()["skip_parameter_validation"]:
        for est in ests:
            est._validate_params()
    return True, first


def _ridge_sums(X: Any, target: Any, fit_intercept: bool) -> tuple[Any, ...]:
    """What every alpha's fit on ``X, target`` shares: ``(XᵀX, Xᵀy, X_offset, y_offset, X_scale)`` of the rows
    centred as ``Ridge.fit`` centres them."""
    from sklearn.linear_model._base import _preprocess_data
    from sklearn.utils.extmath import safe_sparse_dot

    Xc, yc, X_offset, y_offset, X_scale, _ = _preprocess_data(X, target, fit_intercept=fit_intercept, copy=True,
                                                              sample_weight=None, rescale_with_sw=False)
    A = safe_sparse_dot(Xc.T, Xc, dense_output=True)
    Xy = safe_sparse_dot(Xc.T, np.reshape(yc, (-1, 1)), dense_output=True)
    return A, Xy, X_offset, y_offset, X_scale


RULES: tuple[Any, ...] = (RidgeRule,)


def rule_for(est: Any) -> tuple[Any, Any] | None:
    """``(rule, group key)`` of the first rule that batches ``est``, or None."""
    for rule in RULES:
        key = rule.group_key(est)
        if key is not None:
            return rule, key
    return None


# metrics that score a 2-D target column by column with ``multioutput="raw_values"``, each column as the
# metric scores that one prediction (checked in every batch: see the module's docstring)
def _column_metrics() -> tuple[Any, ...]:
    from sklearn import metrics

    return (metrics.r2_score, metrics.mean_squared_error, metrics.root_mean_squared_error,
            metrics.mean_absolute_error, metrics.explained_variance_score, metrics.median_absolute_error,
            metrics.mean_absolute_percentage_error)


def column_metric(scorer: Any, est: Any) -> tuple[Any, float, dict[str, Any]] | None:
    """``(metric, sign, keywords)`` when ``scorer(est, X, y)`` is ``sign * metric(y, est.predict(X),
    **keywords)`` for a metric of :func:`_column_metrics`; None otherwise (the candidates are then scored one
    by one)."""
    from sklearn.base import RegressorMixin
    from sklearn.metrics import r2_score
    from sklearn.metrics._scorer import _PassthroughScorer, _Scorer

    if type(scorer) is _PassthroughScorer:
        return (r2_score, 1.0, {}) if type(est).score is RegressorMixin.score else None
    if type(scorer) is not _Scorer or scorer._response_method not in ("predict", ("predict",)):
        return None
    kwargs = dict(scorer._kwargs)
    if "multioutput" in kwargs or "sample_weight" in kwargs or scorer._score_func not in _column_metrics():
        return None
    return scorer._score_func, scorer._sign, kwargs


# the most values (rows × candidates) one metric call of a batch scores: the predictions and the target as
# columns are two arrays of this size (64 MB each in float64)
COLUMN_VALUES = 1 << 23


def _target(y: Any) -> Any:
    """``y`` as a 1-D NumPy array of real numbers (a NumPy array, or a pandas ``Series`` of a NumPy dtype), or None
    for anything else (scikit-learn's own validation then runs one candidate at a time)."""
    if type(y).__name__ == "Series" and type(y).__module__.startswith("pandas") and isinstance(y.dtype, np.dtype):
        y = y.to_numpy()
    if type(y) is not np.ndarray or y.ndim != 1 or y.dtype.kind not in "fiu":
        return None
    return y


def _columns(rule: Any, fitted: list[Any], X: Any) -> Any:
    """The candidates' predictions of ``X`` as the columns of one Fortran-ordered array."""
    P = np.empty((X.shape[0], len(fitted)), dtype=np.result_type(X.dtype, np.float64), order="F")
    for j, est in enumerate(fitted):
        P[:, j] = rule.predict(est, X)
    return P


def score_columns(rule: Any, fitted: list[Any], scorer: Any, X: Any, y: Any) -> list[Any] | None:
    """Every candidate's score of ``(X, y)`` from one call of the scorer's metric, or None where the scorer is
    not one :func:`column_metric` knows, or, in a kind's first batch, the first candidate's batched prediction
    or score is not scikit-learn's own bit for bit."""
    known = column_metric(scorer, fitted[0])
    target = _target(y)
    if known is None or type(X) is not np.ndarray or target is None or len(target) < 2:
        return None
    metric, sign, kwargs = known
    kind = ("score", sklearn.__version__, np.__version__, rule.name, metric, sign, repr(sorted(kwargs.items())),
            X.dtype.str, X.flags.c_contiguous, X.flags.f_contiguous, type(y).__name__, target.dtype.str)
    as_type: Any = _CHECKED.get(kind)
    values: list[Any] = []
    step = max(2, COLUMN_VALUES // max(1, X.shape[0]))   # candidates per metric call: bounded memory
    for lo in range(0, len(fitted), step):
        P = _columns(rule, fitted[lo:lo + step], X)
        if as_type is None and lo == 0 and not np.array_equal(P[:, 0], fitted[0].predict(X)):
            return None
        Y = np.asfortranarray(np.broadcast_to(target[:, None], P.shape))
        values.extend(sign * metric(Y, P, multioutput="raw_values", **kwargs))
        if as_type is None:   # this kind's first batch: the first candidate scored by the scorer itself too
            real = scorer(fitted[0], X, y)
            if not isinstance(real, (float, np.floating)) or \
                    np.float64(real).tobytes() != np.float64(values[0]).tobytes():
                return None
            as_type = _CHECKED[kind] = type(real)
    return [as_type(v) for v in values]


@saved_operation
def pick(values: tuple[Any, ...], i: int) -> Any:
    """Item ``i`` of a batch's outputs: one candidate's score entry."""
    return values[i]


def fit_batch(rule: Any, ests: list[Any], X: Any, y: Any,
              key: bytes | None = None) -> tuple[list[Any] | None, float]:
    """``(the fitted candidates or None, seconds)``; None where the rule declines or anything raised (the
    candidates are then fitted one by one, with their own errors and warnings).  ``key``: the store key of
    the batch's shared part (:func:`~gpunets.tuning.stored.shared_key`; None: not stored)."""
    start = time.perf_counter()
    try:
        fitted = rule.fit(ests, X, y, key) if key is not None else rule.fit(ests, X, y)
    except Exception:  # noqa: BLE001 - the candidates are fitted one by one, which reports it
        fitted = None
    return fitted, time.perf_counter() - start


@saved_operation
def fit_and_score_batch(rule: Any, ests: tuple[Any, ...], users: tuple[tuple[int, ...], ...], head: tuple[Any, ...],
                        X: Any, y: Any, X_test: Any, y_test: Any, X_train: Any, y_train: Any) -> tuple[Any, ...]:
    """The score entries of candidates whose last steps ``ests`` one batch rule fits together, in one task:
    :func:`~gpunets.tuning.tasks.fit_and_score` of each, bit for bit, with the batch's fit time shared among
    them.  ``X`` is the fold's training rows or the previous step's :class:`~gpunets.tuning.tasks.Stage`,
    ``users`` per candidate as :func:`~gpunets.tuning.tasks.fit_and_score` takes them.  With a store of fitted
    states in force, each step is looked up first and each one the batch fits is kept (one entry each); one by
    one where the rule declines or the batch fails."""
    stage = X if isinstance(X, tasks.Stage) else None
    rows, computed = tasks.materialize(stage.train if stage is not None else X)   # a loaded step's output, now
    if isinstance(rows, tasks.Failed):   # an upstream step failed: each candidate reports it
        return tuple(tasks.fit_and_score(est, None, {}, X, y, u, head, X_test, y_test, X_train, y_train)
                     for est, u in zip(ests, users))
    rows, y_fit = tasks.aligned(rows, y)
    x_key = stage.key if stage is not None else None
    depth = len(stage.seconds) if stage is not None else 0
    y_key = stored.data_key(y_fit) if _store.current_store() is not None else None   # once for the batch
    lookups: list[Any] = ([stored.load_step(est, None, {}, rows, y_fit, x_key, y_key) for est in ests]
                          if _store.current_store() is not None else [None] * len(ests))
    todo = [i for i, found in enumerate(lookups) if found is None or found[0] is None]
    steps: list[Any] = [None] * len(ests)
    skey = stored.shared_key(rule.name, rule.group_key(ests[todo[0]]), rows, y_fit, x_key, y_key) \
        if len(todo) > 1 else None
    fitted, secs = fit_batch(rule, [ests[i] for i in todo], rows, y_fit, skey) if len(todo) > 1 else (None, 0.0)
    batch = set(todo) if fitted is not None else set()   # the candidates the batch fitted
    for i, est in zip(todo, fitted or ()):
        if lookups[i] is not None:
            stored.keep_step(lookups[i][1], est)
        steps[i] = (est, None, secs / len(todo), ())
    for i, step in enumerate(steps):
        if step is None:   # loaded from the store, or fitted on its own
            est, _, seconds, _, loaded = tasks._keyed_fit_step(ests[i], None, True, {}, rows, y_fit, x_key,
                                                               lookup=lookups[i], depth=depth)
            steps[i] = (est, None, seconds, loaded)
    if stage is not None:
        X_test, X_train, upstream, before = stage.test, stage.score, stage.seconds, stage.loaded + computed
    else:
        upstream, before = (), ()
    scores = _batch_scores(rule, [s[0] for s in steps], head, X_test, y_test, X_train, y_train)
    outs = []
    for j, ((est, _, share, loaded), u) in enumerate(zip(steps, users)):
        if scores is None:   # scored one by one, as score_fit does
            out = tasks.score_fit(None, u, head, (est, None, share, before + loaded), X_test, y_test, X_train,
                                  y_train, *upstream)
        else:
            out = {"n_test_samples": head[3], "fit_time": tasks.share_seconds(u, *upstream, share),
                   "test_scores": scores[0][j]}
            if scores[1] is not None:
                out["train_scores"] = scores[1][j]
            out["score_time"] = scores[2]
            out["fit_error"] = None
            if before + loaded:
                out["_stored"] = before + loaded
        if j in batch:
            out["_batched"] = True   # counted in search_report_.batched
        outs.append(out)
    return tuple(outs)


def _batch_scores(rule: Any, fitted: list[Any], head: tuple[Any, ...], X_test: Any, y_test: Any, X_train: Any,
                  y_train: Any) -> tuple[list[Any], list[Any] | None, float] | None:
    """``(test scores, train scores or None, each candidate's share of the scoring seconds)`` from one metric
    call per set of rows, or None: the candidates are scored one by one (a multi-metric scorer, the scorer's
    own parameters, rows that failed to transform, a scorer or metric :func:`column_metric` does not know, or
    any difference from scikit-learn's own score of the first candidate)."""
    scorer, _, train, _, n_scores, score_params = head
    if n_scores is not None or score_params is not None or isinstance(X_test, tasks.Failed) \
            or isinstance(X_train, tasks.Failed) or any(isinstance(e, tasks.Failed) for e in fitted):
        return None
    start = time.perf_counter()
    try:
        X_test, y_test, X_train, y_train = tasks.aligned(X_test, y_test, X_train, y_train)
        test = score_columns(rule, fitted, scorer, X_test, y_test)
        if test is None:
            return None
        trained = score_columns(rule, fitted, scorer, X_train, y_train) if train else None
        if train and trained is None:
            return None
    except Exception:  # noqa: BLE001 - scored one by one, which reports it as scikit-learn does
        return None
    return test, trained, (time.perf_counter() - start) / len(fitted)

"""Candidates of a search on a GPU fitted and scored together: :mod:`gpunets.tuning.batched` on the array-API route.

A search on ``device="cuda"`` without cuML fits ``Ridge(solver="svd")`` as scikit-learn's array-API twin on CuPy
(:func:`~gpunets.compute.models.resolve_estimator`: ``"array_api"``), one candidate after the other: per alpha and
fold a validation, a centring, a singular value decomposition of the centred rows and six host synchronisations;
per score a prediction and a metric call with its own. Here the candidates of one fold that differ only in
``alpha`` are one task:

* **one factorization per fold.** The rows validated and centred as ``Ridge.fit`` does (scikit-learn's own
  ``validate_data`` and ``_preprocess_data``), ``U, s, Vt = svd(Xc)`` and ``Uᵀy`` once; then scikit-learn's
  ``_solve_svd`` step per alpha: the filter factors ``s / (s² + alpha)`` of every alpha in one elementwise
  operation (elementwise, so each value is the one a single fit computes), and per alpha the product
  ``Vtᵀ (d Uᵀy)`` on an array of the very shape and layout scikit-learn multiplies, then ``_set_intercept``.
  Each fitted candidate is therefore its own ``fit`` **bit for bit** (the same operations on the same library;
  the one data-dependent step of ``_solve_svd``, ``s[s > 1e-15]``, is a select instead, which needs no host
  synchronisation and gives the same values);
* **one metric call per fold.** The predictions (``X @ coef_ + intercept_``, as ``predict`` computes them) are the
  columns of one array and the scorer's metric scores them with ``multioutput="raw_values"``
  (:func:`~gpunets.tuning.batched.column_metric`); the test and training scores of every candidate then come to
  the host in **one copy**. A column reduction of CuPy sums in another order than the reduction of one
  prediction, so these scores are scikit-learn's to within 1e-9 relative (measured: the last bits) where they are
  not bit for bit; on the fake GPU (NumPy) they are bit for bit.

Nothing is taken on trust, as on the CPU: in the first batch of each kind in a process (scikit-learn's version,
the array namespace, the rows' dtype and layout, the metric), the first candidate is also fitted, predicted and
scored by scikit-learn itself; the fit and prediction must equal it bit for bit, the score bit for bit or within
1e-9 relative (which of the two is remembered with the kind and said by the report:
:attr:`~gpunets.tuning.report.SearchReport.batched_close`); else the candidates are fitted and scored one at a
time, as without batching. A failure of any kind in a batch does the same, so errors, ``error_score`` and
warnings are those of candidate-by-candidate fits. With a store of fitted states in force the batch is not used
(each candidate's fit is stored and loaded on its own, as without batching).

Not done: stacking the folds' factorizations into one batched SVD. The folds are separate tasks of the search's
network, and CuPy's batched SVD is another algorithm (Jacobi) that would not reproduce scikit-learn's steps.
"""

from __future__ import annotations

import time
from typing import Any

import sklearn

from gpunets.base.saved import saved_operation
from gpunets.devices import store as _store
from gpunets.devices.data import to_device
from gpunets.tuning import batched, tasks

__all__ = ["CLOSE", "RULES", "RidgeSVDRule", "fit_and_score_batch", "rule_for", "score_columns"]

#: The relative tolerance of a batch's scores where they are not scikit-learn's bit for bit.
CLOSE = 1e-9

# kinds of batch checked against scikit-learn in this process (see the module's docstring); a fit kind's value
# is True, a score kind's ``(the type of the scorer's result, True where bit for bit)``
_CHECKED: dict[Any, Any] = {}



def _namespace(*arrays: Any) -> Any:
    """The array namespace scikit-learn dispatches to for ``arrays``, or None for NumPy (the CPU rules' arrays)."""
    from sklearn.utils._array_api import _is_numpy_namespace, get_namespace  # lazy: scikit-learn's internals

    xp, compliant = get_namespace(*arrays)
    return None if not compliant or _is_numpy_namespace(xp) else xp


def _same(a: Any, b: Any, xp: Any) -> bool:
    """Whether two device arrays (or 0-d arrays, or floats) hold the same values bit for bit (one host read)."""
    a, b = xp.asarray(a), xp.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool(xp.all(a == b))


class RidgeSVDRule:
    """``Ridge(solver="svd")`` fits on CuPy rows under array-API dispatch that differ only in ``alpha``: one
    validation, centring and SVD per fold, then scikit-learn's ``_solve_svd`` step per alpha."""

    name = "ridge (shared SVD across alpha, array API)"

    @staticmethod
    def group_key(est: Any) -> Any:
        return batched.ridge_group_key(est, ("svd",), "Ridge svd")

    @staticmethod
    def fit(ests: list[Any], X: Any, y: Any) -> list[Any] | None:
        """Each of ``ests`` fitted on the device rows ``X, y`` (under ``array_api_dispatch``), or None where the
        rows are not ones this rule covers or, in a kind's first batch, the first candidate's fit differs from
        its own ``fit`` by a bit."""
        from sklearn.base import clone  # lazy: scikit-learn's internals, loaded with the search
        from sklearn.linear_model._base import _preprocess_data
        from sklearn.linear_model._ridge import _get_valid_accept_sparse
        from sklearn.utils._array_api import get_namespace_and_device, move_to
        from sklearn.utils.validation import validate_data

        if not sklearn.get_config()["array_api_dispatch"]:
            return None
        xp = _namespace(X)
        if xp is None or _namespace(y) is not xp or getattr(X, "ndim", 0) != 2 or getattr(y, "ndim", 0) != 1 \
                or X.dtype not in (xp.float64, xp.float32) or X.shape[0] != y.shape[0] or X.shape[0] < 2:
            return None
        fit_intercept = bool(ests[0].fit_intercept)
        kind = ("Ridge.fit svd", sklearn.__version__, xp.__name__, str(X.dtype), str(y.dtype), fit_intercept,
                bool(X.flags.c_contiguous), bool(X.flags.f_contiguous))
        attributes = {"n_features_in_": X.shape[1], "n_iter_": None, "solver_": "svd"}
        ok, first = batched.check_first(ests, X, y, kind in _CHECKED, attributes)
        if not ok:
            return None
        # Ridge.fit's steps, once for every alpha
        carrier = clone(ests[0])
        _, _, dev = get_namespace_and_device(X)
        y, _ = move_to(y, None, xp=xp, device=dev)
        X, y = validate_data(carrier, X, y, accept_sparse=_get_valid_accept_sparse(False, "svd"),
                             dtype=[xp.float64, xp.float32], force_writeable=True, multi_output=True, y_numeric=True)
        Xc, yc, X_offset, y_offset, X_scale, _ = _preprocess_data(X, y, fit_intercept=fit_intercept, copy=True,
                                                                  sample_weight=None, rescale_with_sw=False)
        # _ridge_regression's (check_input=False) and _solve_svd's steps, the parts that do not depend on alpha
        y2 = xp.reshape(yc, (-1, 1))
        U, s, Vt = xp.linalg.svd(Xc, full_matrices=False)
        UTy = U.T @ y2
        alphas = xp.asarray([float(est.alpha) for est in ests], dtype=Xc.dtype, device=dev)
        s_row = xp.reshape(s, (1, -1))
        idx = s_row > 1e-15   # same default value as scipy.linalg.pinv (scikit-learn's _solve_svd)
        s_nnz = xp.where(idx, s_row, xp.ones_like(s_row))   # the values s[idx] (the others: never used)
        # d[idx] = s_nnz / (s_nnz**2 + alpha), d = 0 elsewhere: each alpha's row, elementwise as scikit-learn
        d = xp.where(idx, s_nnz / (s_nnz**2 + xp.reshape(alphas, (-1, 1))),
                     xp.zeros((len(ests), s.shape[0]), dtype=Xc.dtype, device=dev))
        d_UT_y = d * xp.reshape(UTy, (1, -1))
        fitted: list[Any] = []
        for j, est in enumerate(ests):
            column = xp.reshape(xp.asarray(d_UT_y[j, :], copy=True), (-1, 1))   # (k, 1), as _solve_svd's
            out = clone(est)
            vars(out).update(attributes)
            out.coef_ = xp.asarray(xp.reshape((Vt.T @ column).T, (-1,)))
            out._set_intercept(X_offset, y_offset, X_scale)
            fitted.append(out)
        if first is not None:
            if not (_same(fitted[0].coef_, first.coef_, xp) and _same(fitted[0].intercept_, first.intercept_, xp)):
                return None
            _CHECKED[kind] = True
            fitted[0] = first
        return fitted

    @staticmethod
    def predict(est: Any, X: Any) -> Any:
        """``LinearModel._decision_function`` of rows ``est.predict`` accepts unchanged."""
        return X @ est.coef_ + est.intercept_


RULES: tuple[Any, ...] = (RidgeSVDRule,)


def rule_for(est: Any, route: Any) -> tuple[Any, Any] | None:
    """``(rule, group key)`` of the first rule that batches ``est`` on ``route`` (a step's
    :class:`~gpunets.compute.models.Resolved`: only the array-API route on a GPU), or None."""
    if getattr(route, "path", None) != "array_api" or not route.device.is_cuda:
        return None
    for rule in RULES:
        key = rule.group_key(est)
        if key is not None:
            return rule, key
    return None


def score_columns(rule: Any, fitted: list[Any], scorer: Any, X: Any, y: Any) -> tuple[Any, bool, type] | None:
    """``(every candidate's score of (X, y) as one device array, whether bit for bit, the scorer's result type)``
    from one call of the
    scorer's metric, or None where the scorer is not one :func:`~gpunets.tuning.batched.column_metric` knows, or,
    in a kind's first batch, the first candidate's prediction is not scikit-learn's bit for bit or its score
    differs from the scorer's own by more than :data:`CLOSE` relative."""
    known = batched.column_metric(scorer, fitted[0])
    xp = _namespace(X)
    if known is None or xp is None or _namespace(y) is not xp or getattr(y, "ndim", 0) != 1 or y.shape[0] < 2 \
            or y.shape[0] != X.shape[0]:
        return None
    metric, sign, kwargs = known
    kind = ("score svd", sklearn.__version__, xp.__name__, rule.name, metric, sign, repr(sorted(kwargs.items())),
            str(X.dtype), str(y.dtype))
    checked = _CHECKED.get(kind)
    n, m = X.shape[0], len(fitted)
    parts = []
    step = max(2, batched.COLUMN_VALUES // max(1, n))   # candidates per metric call: bounded memory
    for lo in range(0, m, step):
        chunk = fitted[lo:lo + step]
        # the predictions as the rows of a C-ordered array: its transpose holds them as contiguous columns
        P = xp.stack([rule.predict(est, X) for est in chunk])
        if checked is None and lo == 0 and not _same(P[0, :], fitted[0].predict(X), xp):
            return None
        Y = xp.tile(xp.reshape(y, (1, -1)), (P.shape[0], 1))   # C-ordered too: each column's sums as one's
        parts.append(sign * metric(Y.T, P.T, multioutput="raw_values", **kwargs))
    values = xp.concat(parts) if len(parts) > 1 else parts[0]
    if checked is None:   # this kind's first batch: the first candidate scored by the scorer itself too
        real = scorer(fitted[0], X, y)
        if not isinstance(real, float):
            return None
        first = float(to_device(values[:1], "cpu")[0])
        exact = first == real or (first != first and real != real)
        if not exact and not abs(first - real) <= CLOSE * abs(real):
            return None
        checked = _CHECKED[kind] = (type(real), exact)
    return values, checked[1], checked[0]


def _batch_scores(rule: Any, fitted: list[Any], head: tuple[Any, ...], X_test: Any, y_test: Any, X_train: Any,
                  y_train: Any) -> tuple[list[Any], list[Any] | None, float, bool] | None:
    """``(test scores, train scores or None, each candidate's share of the scoring seconds, bit for bit)``: one
    metric call per set of rows and one copy to the host for both, or None (scored one by one: as
    :func:`gpunets.tuning.batched._batch_scores` says)."""
    scorer, _, train, _, n_scores, score_params = head
    if n_scores is not None or score_params is not None or isinstance(X_test, tasks.Failed) \
            or isinstance(X_train, tasks.Failed):
        return None
    start = time.perf_counter()
    try:
        test = score_columns(rule, fitted, scorer, X_test, y_test)
        trained = score_columns(rule, fitted, scorer, X_train, y_train) if train else None
        if test is None or (train and trained is None):
            return None
        xp = _namespace(test[0])
        both = test[0] if trained is None else xp.concat([test[0], trained[0]])
        host = to_device(both, "cpu")   # the one copy to the host of this fold's scores
    except Exception:  # noqa: BLE001 - scored one by one, which reports it as scikit-learn does
        return None
    m = len(fitted)
    values = [test[2](v) for v in host]
    return (values[:m], values[m:] if train else None, (time.perf_counter() - start) / m,
            test[1] and (trained is None or trained[1]))


@saved_operation
def fit_and_score_batch(rule: Any, routes: tuple[Any, ...], users: tuple[tuple[int, ...], ...],
                        head: tuple[Any, ...], X: Any, y: Any, X_test: Any, y_test: Any, X_train: Any,
                        y_train: Any) -> tuple[Any, ...]:
    """The score entries of candidates whose last steps one rule of :data:`RULES` fits together on a GPU, in one
    task: :func:`~gpunets.tuning.tasks.fit_and_score` of each (the fits bit for bit, the scores bit for bit or
    within :data:`CLOSE` relative), with the batch's fit time shared among them. ``routes``: each candidate's
    last step resolved (:class:`~gpunets.compute.models.Resolved`, the array-API route of one GPU; its estimator
    is the one fitted); ``X`` is the fold's training rows or the previous step's
    :class:`~gpunets.tuning.tasks.Stage`. One by one where the rule declines, the batch fails, or a store of
    fitted states is in force."""
    stage = X if isinstance(X, tasks.Stage) else None
    rows = stage.train if stage is not None else X

    def one_by_one() -> tuple[Any, ...]:
        return tuple(tasks.fit_and_score(r.estimator, r, {}, X, y, u, head, X_test, y_test, X_train, y_train)
                     for r, u in zip(routes, users))

    if _store.current_store() is not None or isinstance(rows, (tasks.Failed, tasks.Deferred)):
        return one_by_one()
    upstream: tuple[float, ...] = ()
    if stage is not None:
        X_test, X_train, upstream = stage.test, stage.score, stage.seconds
    start = time.perf_counter()
    with tasks.on_device(routes[0]):
        try:
            rows_d, y_d = tasks.moved(routes[0], rows, y)
            fitted = rule.fit([r.estimator for r in routes], rows_d, y_d)
        except Exception:  # noqa: BLE001 - the candidates are fitted one by one, which reports it
            fitted = None
        if fitted is None:
            return one_by_one()
        share = (time.perf_counter() - start) / len(routes)
        X_test, y_test, X_train, y_train = tasks.moved(routes[0], X_test, y_test, X_train, y_train)
        scores = _batch_scores(rule, fitted, head, X_test, y_test, X_train, y_train)
    outs = []
    for j, (est, u) in enumerate(zip(fitted, users)):
        if scores is None:   # scored one by one, as score_fit does
            out = tasks.score_fit(routes[j], u, head, (est, None, share, ()), X_test, y_test, X_train, y_train,
                                  *upstream)
        else:
            out = {"n_test_samples": head[3], "fit_time": tasks.share_seconds(u, *upstream, share),
                   "test_scores": scores[0][j]}
            if scores[1] is not None:
                out["train_scores"] = scores[1][j]
            out["score_time"] = scores[2]
            out["fit_error"] = None
        # counted in search_report_.batched, batched_gpu and batched_close
        out["_batched"] = "gpu" if scores is None or scores[3] else "gpu close"
        outs.append(out)
    return tuple(outs)

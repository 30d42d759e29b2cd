"""A stack's network: the branches of its base models per fold, and the functions its nodes run.

Part of :mod:`gpunets.compose.stacking`: :class:`StackNetwork` builds the learning network of a
`gn.StackingRegressor` / `gn.StackingClassifier` from its parameters (a branch per base model and fold, the
meta-features, the final estimator, the routes of sample weights); the functions are what its operation nodes
call (assembling out-of-fold predictions, decoding labels, averaging the folds' transforms).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats
from sklearn.base import BaseEstimator, is_classifier, is_regressor
from sklearn.metrics import accuracy_score, r2_score
from sklearn.model_selection import check_cv
from sklearn.utils.metadata_routing import process_routing

from gpunets.base.saved import saved_operation
from gpunets.compose.routing import routing_enabled, takes_sample_weight, weights_refused
from gpunets.core.machines import OPERATIONS, machine
from gpunets.core.nodes import Source, node
from gpunets.devices.data import take_rows as _take
from gpunets.devices.fingerprint import fingerprint
from gpunets.devices.placement import host_only

#: The name of the node that collects the folds' summaries of a stack (its cv report).
SUMMARY = "[cv report]"


def take_rows(value: Any, rows: np.ndarray) -> Any:
    """``value`` at ``rows`` (``.iloc`` for pandas)."""
    return _take(value, rows)


def _to_numpy(p: Any) -> Any:
    if hasattr(p, "to_numpy"):
        return p.to_numpy()
    return p


@host_only  # NumPy inside: runs on the CPU, its GPU inputs moved to the host by the plan
def assemble_folds(test_indices: tuple[np.ndarray, ...], n_rows: int, *preds: Any) -> Any:
    """Out-of-fold predictions in original row order (``cross_val_predict``'s result)."""
    folds = [_to_numpy(p) for p in preds]
    if isinstance(folds[0], list):  # pragma: no cover - multi-output predict_proba lists
        return [assemble_folds(test_indices, n_rows, *[p[j] for p in folds]) for j in range(len(folds[0]))]
    first = np.asarray(folds[0])
    out = np.empty((n_rows,) + first.shape[1:], dtype=np.result_type(*[np.asarray(p).dtype for p in folds]))
    for idx, p in zip(test_indices, folds):
        out[idx] = p
    return out


@host_only  # NumPy inside: runs on the CPU, its GPU inputs moved to the host by the plan
def enforce_order(classes: Any, n_classes: Any, method: str, predictions: Any) -> Any:
    """Columns for classes absent from a fold's training rows (``cross_val_predict``'s rule).

    ``classes`` is an array of labels and ``n_classes`` their count; multilabel predictions (a list, one
    array per label) take a list of classes and of counts.
    """
    from sklearn.model_selection._validation import _enforce_prediction_order

    if isinstance(predictions, list):
        return [_enforce_prediction_order(c, np.asarray(p), n, method)
                for c, n, p in zip(classes, n_classes, predictions)]
    return _enforce_prediction_order(classes, np.asarray(predictions), n_classes, method)


@host_only  # NumPy inside: runs on the CPU, its GPU inputs moved to the host by the plan
def concat_predictions(methods: tuple[str, ...], n_classes: int, passthrough: bool, *values: Any) -> Any:
    """scikit-learn's ``_concatenate_predictions``: 2-D columns, binary ``predict_proba`` minus its first column."""
    from scipy import sparse

    preds = values[:len(methods)]
    X_meta: list[Any] = []
    for meth, p in zip(methods, preds):
        p = _to_numpy(p)
        if isinstance(p, list):
            X_meta.extend(q[:, 1:] for q in p)
        elif p.ndim == 1:
            X_meta.append(p.reshape(-1, 1))
        elif meth == "predict_proba" and n_classes == 2:
            X_meta.append(p[:, 1:])
        else:
            X_meta.append(p)
    if passthrough:
        X = values[len(methods)]
        if sparse.issparse(X):
            return sparse.hstack(X_meta + [X], format=X.format)
        X_meta.append(_to_numpy(X))
    return np.hstack(X_meta)


@host_only  # NumPy inside: runs on the CPU, its GPU inputs moved to the host by the plan
def decode_labels(classes: np.ndarray, y: Any) -> Any:
    """Encoded predictions back to the original labels (``LabelEncoder.inverse_transform``)."""
    return classes[np.asarray(y).astype(np.intp)]


@host_only  # NumPy inside: runs on the CPU, its GPU inputs moved to the host by the plan
def decode_multilabel(classes: tuple[np.ndarray, ...], y: Any) -> Any:
    """Encoded multilabel predictions back to each label's values (one ``LabelEncoder`` per column)."""
    y = np.asarray(_to_numpy(y)).astype(np.intp)
    return np.array([c[y[:, j]] for j, c in enumerate(classes)]).T


@host_only  # NumPy inside: runs on the CPU, its GPU inputs moved to the host by the plan
def multilabel_proba(proba: Any) -> Any:
    """scikit-learn's multilabel ``predict_proba`` of a stack: column 0 of each label's probabilities."""
    if isinstance(proba, list):
        return np.array([p[:, 0] for p in proba]).T
    return proba


@saved_operation(checked={1: "operation"})
@host_only  # the prefit member is called as is (scikit-learn's cv="prefit"), on the host
def prefit_output(estimator: Any, method: str, X: Any, state: Any = None) -> Any:
    """``estimator.method(X)`` of a member fitted before the stack (``cv="prefit"``); ``method`` is one of
    :data:`~gpunets.core.machines.OPERATIONS`, never another method.

    ``state`` (unused here) is the member's fingerprint at the stack's fit: a member refitted in place
    changes it, so the final estimator retrains (the network compares node constants by value).
    """
    if method not in OPERATIONS:
        msg = f"prefit_output: {method!r} is not a machine operation; operations are {list(OPERATIONS)}."
        raise ValueError(msg)
    return getattr(estimator, method)(X)


@host_only  # NumPy inside: runs on the CPU, its GPU inputs moved to the host by the plan
def average_folds(vote: bool, *preds: Any) -> Any:
    """The cv-ensemble's output: fold models' outputs averaged (majority label for class ``predict``)."""
    preds = tuple(_to_numpy(p) for p in preds)
    if isinstance(preds[0], list):
        return [average_folds(vote, *[p[j] for p in preds]) for j in range(len(preds[0]))]
    stacked = np.stack([np.asarray(p) for p in preds])
    if vote:
        return stats.mode(stacked, axis=0, keepdims=False).mode   # ties: the smallest label
    return stacked.mean(axis=0)


def _decided(p: Any, method: str, multilabel: bool) -> Any:
    """Class labels (encoded) from a classifier member's stacked output, for its default score (accuracy)."""
    if isinstance(p, list):
        return np.column_stack([np.asarray(q).argmax(axis=1) for q in p])
    p = np.asarray(p)
    if method == "predict":
        return p
    if p.ndim == 1 or multilabel:
        return (p > (0.5 if method == "predict_proba" else 0.0)).astype(np.intp)
    return p.argmax(axis=1)


@host_only  # NumPy inside: runs on the CPU, its GPU inputs moved to the host by the plan
def summarize_members(tests: tuple[np.ndarray, ...], kinds: tuple[str, ...], methods: tuple[str, ...],
                      n_classes: int, y: Any, *preds: Any) -> np.ndarray:
    """Per member: its number of stacked columns, then its score on each cv fold (``cv_scores_``).

    The scores come from the out-of-fold predictions the final estimator trains on (no extra fit):
    R² for regressors, accuracy for classifiers (the class with the largest probability or decision).
    """
    y = np.asarray(_to_numpy(y))
    rows = []
    for kind, meth, p in zip(kinds, methods, preds):
        p = [_to_numpy(q) for q in p] if isinstance(p, list) else _to_numpy(p)
        width = concat_predictions((meth,), n_classes, False, p).shape[1]
        scores = []
        for te in tests:
            pk = [np.asarray(q)[te] for q in p] if isinstance(p, list) else np.asarray(p)[te]
            if kind == "classifier":
                scores.append(accuracy_score(y[te], _decided(pk, meth, y.ndim == 2)))
            else:
                scores.append(r2_score(y[te], pk))
        rows.append([width, *scores])
    return np.asarray(rows, dtype=float)


class MemberSummary(BaseEstimator):
    """Keeps :func:`summarize_members`' result in the fitted stack (its ``transform`` is the identity)."""

    def fit(self, S: Any, y: Any = None) -> MemberSummary:
        self.summary_ = np.asarray(S, dtype=float)
        return self

    def transform(self, X: Any) -> Any:
        return X


def _is_model(est: Any) -> bool:
    return is_classifier(est) or is_regressor(est)


def enforce_order_partial(present: Any, n_classes: Any, method: str) -> Any:
    from functools import partial

    fn = partial(enforce_order, present, n_classes, method)
    fn.__name__ = "enforce_order"  # type: ignore[attr-defined]
    return host_only(fn)


def _fold_order(y_train: np.ndarray, classes: Any, method: str, multilabel: bool) -> Any:
    """The node function padding a fold model's output for classes its rows lack, or None when complete."""
    if classes is None or method == "predict":
        return None
    if multilabel:
        present = [np.unique(y_train[:, j]) for j in range(y_train.shape[1])]
        counts = [len(c) for c in classes]
        if all(len(p) == c for p, c in zip(present, counts)):
            return None
        return enforce_order_partial(present, counts, method)
    present1 = np.unique(y_train)
    return None if len(present1) == len(classes) else enforce_order_partial(present1, len(classes), method)


class StackNetwork:
    """Builds a stack's learning network from its parameters (mixed into the stacking estimators)."""

    if TYPE_CHECKING:  # pragma: no cover - the stacking estimator's parameters, fitted classes and checks
        cv: Any
        passthrough: bool
        cv_ensemble: bool
        classes_: Any                  # an array of labels, or one per output (multilabel)

        def _validate_estimators(self) -> tuple[list[str], list[Any]]: ...
        def _validate_final(self) -> Any: ...
        def _methods(self, names: list[str], ests: list[Any]) -> list[str]: ...
        def _devices(self) -> dict[str, Any]: ...

    # --- the network --------------------------------------------------------------------------------------
    def network(self, X: Source, y: Source, sample_weight: Source | None = None) -> dict[str, Any]:
        """One branch per (base model, fold), full-data refits, the final estimator (module docstring).

        ``sample_weight`` reaches the members scikit-learn's stack gives it to (:meth:`_weight_routes`),
        cut to each fold's training rows for the (member, fold) fits.
        """
        names, ests = self._validate_estimators()
        final_est = self._validate_final()
        methods = self._methods(names, ests)
        weighted, final_weighted = self._weight_routes(names, ests, final_est, sample_weight)
        final_w: dict[str, Any] = {"sample_weight": sample_weight} if final_weighted else {}
        dev = self._devices()
        y_data = np.asarray(y.data)
        n = len(y_data)
        self._gn_full_names = list(names)
        n_classes = len(self.classes_) if is_classifier(self) else 0
        kinds = tuple("classifier" if is_classifier(e) else "regressor" for e in ests)
        extra = [X] if self.passthrough else []
        if isinstance(self.cv, str) and self.cv == "prefit":   # members as they are; final on their outputs
            preds = [node(prefit_output, est, meth, X, fingerprint(est), name=f"{name}(prefit)")
                     for name, est, meth in zip(names, ests, methods)]
            meta = node(concat_predictions, tuple(methods), n_classes, bool(self.passthrough), *preds, *extra,
                        name="X_meta")
            summary = machine(MemberSummary(), node(summarize_members, (), kinds, tuple(methods), n_classes, y,
                                                    *preds, name="widths"), name=SUMMARY)
            final = machine(final_est, meta, y, name="final_estimator", device=dev.get("final_estimator"),
                            **final_w)
            return self._outputs(final, meta, summary.transform(meta))
        cv = check_cv(self.cv, y_data, classifier=is_classifier(self))
        if hasattr(cv, "random_state") and cv.random_state is None:
            cv.random_state = np.random.RandomState()
        splits = [(np.asarray(tr), np.asarray(te)) for tr, te in cv.split(np.zeros((n, 1)), y_data)]
        if len(splits) < 2:
            msg = f"{type(self).__name__}: cv={self.cv!r} gave {len(splits)} split(s); stacking needs at least 2."
            raise ValueError(msg)
        test_all = np.concatenate([te for _, te in splits])
        if len(test_all) != n or not np.array_equal(np.sort(test_all), np.arange(n)):
            msg = (f"{type(self).__name__}: the cv splits' test sets must partition the rows (each row in "
                   "exactly one test fold), as cross_val_predict requires; got overlapping or missing rows.")
            raise ValueError(msg)
        multilabel = y_data.ndim == 2 and n_classes > 0
        folds = [(node(take_rows, X, tr, name=f"X[train {k}]"), node(take_rows, y, tr, name=f"y[train {k}]"),
                  node(take_rows, X, te, name=f"X[test {k}]")) for k, (tr, te) in enumerate(splits)]
        fold_w: list[dict[str, Any]] = [{"sample_weight": node(take_rows, sample_weight, tr, name=f"w[train {k}]")}
                                        for k, (tr, _) in enumerate(splits)] if weighted else [{} for _ in splits]
        full_w: dict[str, Any] = {"sample_weight": sample_weight} if weighted else {}
        tests = tuple(te for _, te in splits)
        oof, full_preds = [], []
        self._gn_n_folds = len(splits)
        for name, est, meth, kind in zip(names, ests, methods, kinds):
            d = dev.get(name)
            preds, averaged = [], []
            for k, (Xtr, ytr, Xte) in enumerate(folds):
                m = machine(est, Xtr, ytr, name=f"{name}[fold {k}]", device=d,
                            **(fold_w[k] if name in weighted else {}))
                p = getattr(m, meth)(Xte)
                q = getattr(m, meth)(X) if self.cv_ensemble else None
                order = _fold_order(y_data[splits[k][0]], self.classes_ if n_classes else None, meth, multilabel)
                if order is not None:
                    p = node(order, p)
                    q = node(order, q) if q is not None else None
                preds.append(p)
                averaged.append(q)
            oof.append(node(assemble_folds, tests, n, *preds, name=f"oof[{name}]"))
            if self.cv_ensemble:   # MLJ's cv-ensemble: no refit on all rows, the fold models averaged
                vote = kind == "classifier" and meth == "predict"
                full_preds.append(node(average_folds, vote, *averaged, name=f"{name}[fold average]"))
            else:
                full = machine(est, X, y, name=name, device=d, **(full_w if name in weighted else {}))
                full_preds.append(getattr(full, meth)(X))
        summary = machine(MemberSummary(), node(summarize_members, tests, kinds, tuple(methods), n_classes, y, *oof,
                                                name="cv scores"), name=SUMMARY)
        meta_train = node(concat_predictions, tuple(methods), n_classes, bool(self.passthrough), *oof, *extra,
                          name="X_meta[train]")
        final = machine(final_est, meta_train, y, name="final_estimator", device=dev.get("final_estimator"),
                        **final_w)
        meta = node(concat_predictions, tuple(methods), n_classes, bool(self.passthrough), *full_preds, *extra,
                    name="X_meta")
        return self._outputs(final, meta, summary.transform(meta))

    def _outputs(self, final: Any, meta: Any, transform: Any) -> dict[str, Any]:  # pragma: no cover - overridden
        raise NotImplementedError

    def _weight_routes(self, names: list[str], ests: list[Any], final_est: Any,
                       sample_weight: Source | None) -> tuple[set[str], bool]:
        """Which base estimators (by name) and whether the final estimator train with ``sample_weight``.

        As scikit-learn's stack: without metadata routing every one of them, and one that cannot take
        the weights is an error (raised here, before anything trains); with routing, the base estimators
        that requested them (``process_routing``: unset requests raise ``UnsetMetadataPassedError``), and
        the final estimator always.
        """
        if sample_weight is None:
            return set(), False
        if routing_enabled():
            routed = process_routing(self, "fit", sample_weight=sample_weight.data)
            weighted = {n for n in names if "sample_weight" in routed[n]["fit"]}
            refused = {}
        else:
            weighted = set(names)
            refused = {n: e for n, e in zip(names, ests) if not takes_sample_weight(e)}
        if not takes_sample_weight(final_est):
            refused["final_estimator"] = final_est
        if refused:
            raise weights_refused(type(self).__name__, refused)
        return weighted, True
